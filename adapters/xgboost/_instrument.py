"""Zero-code-change for XGBoost: attach the JSON-configured hook to every training call.

:func:`instrument` wraps ``xgboost.train`` (also reachable as ``xgboost.training.train``)
and the ``train`` that the scikit-learn estimators call (``xgboost.sklearn.train``;
every estimator's ``fit`` trains through it, whatever subclass overrides ``fit``). The
wrapper asks :func:`smdebug.xgboost.get_hook` for the process's hook, creating it from
``SMDEBUG_CONFIG_FILE_PATH`` if needed, and appends it to ``callbacks`` unless an
XGBoost hook is already there. Without a config (or with ``USE_SMDEBUG=0``) the call
goes through untouched. A hook that was given no data uses the call's own: SHAP values
on ``dtrain``, predictions and labels on the last evaluation set that is not ``dtrain``.

:func:`uninstrument` puts the original functions back. Both are idempotent.
"""
from __future__ import annotations

import functools
import importlib
import inspect

from smdebug.capture.instrumentation import Instrumentor, configured_hook
from smdebug.logger import get_logger

logger = get_logger("smdebug.xgboost")

#: (module name, attribute) of each function wrapped.
_TARGETS = (("xgboost", "train"), ("xgboost.training", "train"), ("xgboost.sklearn", "train"))


class XGBoostInstrumentor(Instrumentor):
    """Wraps XGBoost's training entry points so that the configured hook is attached."""

    framework = "XGBoost"
    distribution = "xgboost"  # xgboost-cpu installs the same distribution name
    supported = ((2, 0), None)

    def install(self) -> None:
        for module_name, attr in _TARGETS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if callable(getattr(module, attr, None)):
                self.patches.replace(module, attr, _wrap_train)


INSTRUMENTOR = XGBoostInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented


def _wrap_train(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def train(*args, **kwargs):
        from .hook import get_hook

        hook = configured_hook(get_hook, "XGBoost")
        if hook is None:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # let xgboost report the bad call itself
        callbacks = list(bound.arguments.get("callbacks") or [])
        if not any(isinstance(cb, type(hook)) for cb in callbacks):
            callbacks.append(hook)
            hook._adopt_training_data(bound.arguments.get("dtrain"), bound.arguments.get("evals"))
        bound.arguments["callbacks"] = callbacks
        return original(*bound.args, **bound.kwargs)

    train._smdebug_original = original
    return train

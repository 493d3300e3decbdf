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
import threading
from typing import Dict, Tuple

from smdebug.exceptions import SMDebugError
from smdebug.logger import get_logger

logger = get_logger("smdebug.xgboost")

#: (module name, attribute) of each function wrapped; the same function object may sit
#: under several names, and each keeps its own original.
_TARGETS = (("xgboost", "train"), ("xgboost.training", "train"), ("xgboost.sklearn", "train"))
_originals: Dict[Tuple[str, str], object] = {}
_lock = threading.Lock()
_warned = False


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return bool(_originals)


def instrument() -> None:
    """Wrap XGBoost's training entry points so that the configured hook is attached."""
    with _lock:
        if _originals:
            return
        wrappers: Dict[int, object] = {}  # one wrapper per distinct original function
        for module_name, attr in _TARGETS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            original = getattr(module, attr, None)
            if original is None or not callable(original):
                continue
            wrapper = wrappers.get(id(original))
            if wrapper is None:
                wrapper = wrappers[id(original)] = _wrap_train(original)
            _originals[(module_name, attr)] = original
            setattr(module, attr, wrapper)
        logger.debug("smdebug: instrumented %s", ", ".join(f"{m}.{a}" for m, a in _originals))


def uninstrument() -> None:
    """Restore the functions :func:`instrument` replaced."""
    with _lock:
        for (module_name, attr), original in _originals.items():
            setattr(importlib.import_module(module_name), attr, original)
        _originals.clear()


def _wrap_train(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def train(*args, **kwargs):
        hook = _hook_for_call()
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


def _hook_for_call():
    """The hook to attach, or None. Configuration mistakes raise; anything else only warns."""
    global _warned
    from .hook import get_hook

    try:
        return get_hook(create_if_not_exists=True)
    except SMDebugError:
        raise  # a bad config or out_dir: the user asked for debugging and should know now
    except Exception as exc:  # noqa: BLE001 - never stop training for the debugger's sake
        if not _warned:
            _warned = True
            logger.warning("smdebug: could not create the XGBoost hook (%s: %s); training runs without it",
                           type(exc).__name__, exc)
        return None

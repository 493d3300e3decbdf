"""Zero-code-change for Keras 3 / TensorFlow: attach the configured hook to fit/evaluate/predict.

:func:`instrument` (called by :mod:`smdebug.capture.zero_code_change` once ``tensorflow`` or
``keras`` is imported) wraps ``keras.Model.fit``, ``evaluate`` and ``predict``. Each call
asks :func:`smdebug.tensorflow.get_hook` for the process's KerasHook, creating it from
``SMDEBUG_CONFIG_FILE_PATH`` the first time, and appends it to the call's ``callbacks``
unless a KerasHook is already there. Without a config file, or with ``USE_SMDEBUG=0``,
the call goes through untouched. The hook is closed (end-of-training marker written) when
the process exits.

:func:`uninstrument` puts the original methods back. Both are idempotent. Custom loops
and ``tf.compat.v1`` sessions are not instrumented: they need ``wrap_tape`` or a
SessionHook in the script.
"""
from __future__ import annotations

import functools
import inspect
import sys

from smdebug.capture.instrumentation import Instrumentor, configured_hook
from smdebug.logger import get_logger

logger = get_logger("smdebug.tensorflow")

_METHODS = ("fit", "evaluate", "predict")


class KerasInstrumentor(Instrumentor):
    """Wraps ``keras.Model.fit/evaluate/predict`` so that the configured hook is attached."""

    framework = "Keras"
    distribution = "keras"  # Keras 3: what the KerasHook is written for
    supported = ((3,), (4,))

    def install(self) -> None:
        if _keras_is_being_imported():
            # ``import keras`` imports TensorFlow first, whose import triggered this call:
            # Keras has no Model yet. The bootstrap's "keras" entry (_instrument_keras)
            # instruments once Keras itself has finished importing.
            return
        import keras

        if self.patches:  # importing Keras just now may have instrumented already
            return
        for name in _METHODS:
            self.patches.replace(keras.Model, name, _wrap)


INSTRUMENTOR = KerasInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented


def _keras_is_being_imported() -> bool:
    """Keras' module exists but has not defined ``Model`` yet (its import is under way)."""
    module = sys.modules.get("keras")
    return module is not None and getattr(module, "Model", None) is None


def _wrap(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        hook = _current_hook()
        if hook is None:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["callbacks"] = _with_hook(bound.arguments.get("callbacks"), hook, self)
        except Exception as exc:  # noqa: BLE001 - let Keras report bad arguments itself
            logger.debug("smdebug: not attaching the hook to %s: %s", original.__name__, exc)
            return original(self, *args, **kwargs)
        return original(*bound.args, **bound.kwargs)

    wrapper._smdebug_original = original
    return wrapper


def _current_hook():
    from . import get_hook

    return configured_hook(get_hook, "Keras", hook_type="keras")


def _with_hook(callbacks, hook, model):
    from .keras_hook import KerasHook

    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        if not any(isinstance(cb, KerasHook) for cb in callbacks.callbacks):
            callbacks.append(hook)
            hook.set_model(model)
        return callbacks
    if callbacks is None:
        return [hook]
    callbacks = list(callbacks)
    if not any(isinstance(cb, KerasHook) for cb in callbacks):
        callbacks.append(hook)
    return callbacks

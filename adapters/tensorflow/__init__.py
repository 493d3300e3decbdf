"""smdebug for TensorFlow 2.16+ and Keras 3: ``import smdebug.tensorflow as smd``.

* ``smd.KerasHook(out_dir=...)``: pass it in ``callbacks=`` of ``fit``, ``evaluate`` and
  ``predict``; or use ``hook.wrap_tape(tf.GradientTape())`` / ``hook.wrap_optimizer(opt)``
  in a custom loop (eager or ``tf.function``). See :mod:`smdebug.tensorflow.keras_hook`.
* ``smd.SessionHook``: ``tf.compat.v1`` graph training with ``MonitoredSession``.
* ``smd.EstimatorHook``: 1.0.34's name of ``SessionHook`` (its local example runs it with
  ``MonitoredSession``); ``tf.estimator`` itself is gone from TensorFlow 2.16+.
* ``smd.get_hook(...)``: the process's hook (zero-code-change creates it from
  ``SMDEBUG_CONFIG_FILE_PATH``).

Tensor names are listed in :mod:`smdebug.tensorflow.naming`. The hooks are loaded on
first use: importing this package imports neither Keras nor TensorFlow (zero-code-change
imports it while Keras is still being imported), and with a non-TensorFlow Keras backend
(``KERAS_BACKEND=torch``) a KerasHook never imports TensorFlow.
"""
from typing import Optional

from smdebug import create_trial, modes
from smdebug.collections import Collection, CollectionKeys
from smdebug.exceptions import ConfigError
from smdebug.hook import get_hook as _core_get_hook
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.save_config import SaveConfig, SaveConfigMode

from smdebug.hook import del_hook, set_hook

from .base import TFHookBase

_HOOK_TYPES = ("keras", "session", "estimator")
# Public name -> submodule defining it, imported on first access.
_LAZY = {"KerasHook": "keras_hook", "SessionHook": "session_hook", "EstimatorHook": "session_hook",
         "TFBackend": "backend"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def _hook_class(hook_type: Optional[str]):
    if hook_type is None:
        return None
    if hook_type not in _HOOK_TYPES:
        hint = ""
        if isinstance(hook_type, str) and (hook_type.endswith(".json") or "/" in hook_type):
            hint = ("; it looks like a config path: get_hook's first argument is hook_type (as in smdebug 1.0.34), "
                    "pass get_hook(json_config_path=...)")
        raise ConfigError(f"hook_type must be one of {', '.join(_HOOK_TYPES)} or None, got {hook_type!r}{hint}")
    return __getattr__("KerasHook" if hook_type == "keras" else "SessionHook")  # "estimator": SessionHook


def get_hook(hook_type: Optional[str] = None, json_config_path: Optional[str] = None,
             create_if_not_exists: bool = False):
    """The process's TensorFlow hook (arguments in smdebug 1.0.34's order).

    Returns the last hook constructed if it is of ``hook_type`` (``"keras"``,
    ``"session"``, ``"estimator"``; None: any TensorFlow hook); otherwise, with
    ``create_if_not_exists``, a new one from the JSON config (``json_config_path``, else
    ``SMDEBUG_CONFIG_FILE_PATH``; a KerasHook when no type is given). None when
    ``USE_SMDEBUG`` disables smdebug or there is no config file.
    """
    cls = _hook_class(hook_type)
    hook = _core_get_hook(cls or TFHookBase, json_config_path, create_if_not_exists=False)
    if hook is None and create_if_not_exists:
        hook = _core_get_hook(cls or __getattr__("KerasHook"), json_config_path, create_if_not_exists=True)
    return hook


__all__ = [
    "Collection", "CollectionKeys", "EstimatorHook", "KerasHook", "ModeKeys", "ReductionConfig", "SaveConfig",
    "SaveConfigMode", "SessionHook", "TFBackend", "create_trial", "del_hook", "get_hook", "modes", "set_hook",
]

"""smdebug for PyTorch: ``import smdebug.pytorch as smd``.

``hook = smd.Hook(out_dir=...)``, then ``hook.register_module(model)`` and
``hook.register_loss(loss_module)``; train as usual. Collections: ``weights``, ``biases``,
``gradients``, ``losses`` (saved by default), plus any ``add_module_tensors`` requests.
Steps, modes and tensor names are described in :mod:`smdebug.pytorch.hook`. With
``SMDEBUG_CONFIG_FILE_PATH`` set, an unmodified script is instrumented without any of
this (``docs/zero_code_change.md``).
"""
from smdebug import create_trial, modes
from smdebug.collections import Collection, CollectionKeys
from smdebug.flight_recorder_config import FlightRecorder
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.hook import del_hook, set_hook
from smdebug.save_config import SaveConfig, SaveConfigMode

from .backend import TorchBackend
from .hook import Hook, TrainingStopRequested, get_hook

__all__ = [
    "Collection", "CollectionKeys", "FlightRecorder", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "TorchBackend", "TrainingStopRequested", "create_trial", "del_hook", "get_hook", "modes", "set_hook",
]

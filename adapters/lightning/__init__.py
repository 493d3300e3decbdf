"""smdebug for PyTorch Lightning: ``from smdebug.lightning import DebuggerCallback``.

``Trainer(callbacks=[DebuggerCallback(out_dir=...)])`` saves weights, gradients, losses
and logged metrics with one smdebug step per optimizer step; it drives the PyTorch hook
(:class:`smdebug.pytorch.Hook`). Steps and what is saved: :mod:`smdebug.lightning.callback`.
With ``SMDEBUG_CONFIG_FILE_PATH`` set, an unmodified Lightning script gets the callback
added (:mod:`smdebug.lightning._instrument`). Both ``pytorch_lightning`` and the unified
``lightning.pytorch`` Trainers take the callback.
"""
import importlib.util

if importlib.util.find_spec("pytorch_lightning") is None and importlib.util.find_spec("lightning") is None:
    raise ModuleNotFoundError("smdebug.lightning needs PyTorch Lightning: pip install 'pytorch-lightning>=2.0' "
                              "(smdebug-core's 'lightning' extra), or the unified package (pip install lightning)",
                              name="pytorch_lightning")

from smdebug import create_trial, modes
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.save_config import SaveConfig, SaveConfigMode

from .callback import DebuggerCallback

__all__ = ["DebuggerCallback", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode", "create_trial", "modes"]

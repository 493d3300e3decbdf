"""smdebug for PyTorch Lightning: ``from smdebug.lightning import DebuggerCallback``.

``Trainer(callbacks=[DebuggerCallback(out_dir=...)])`` saves weights, gradients, losses
and logged metrics with one smdebug step per optimizer step; it drives the PyTorch hook
(:class:`smdebug.pytorch.Hook`). Steps and what is saved: :mod:`smdebug.lightning.callback`.
With ``SMDEBUG_CONFIG_FILE_PATH`` set, an unmodified Lightning script gets the callback
added (:mod:`smdebug.lightning._instrument`).
"""
try:
    import pytorch_lightning  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    if exc.name != "pytorch_lightning":
        raise
    raise ModuleNotFoundError("smdebug.lightning needs PyTorch Lightning: pip install 'smdebug-core[lightning]' "
                              "(pytorch-lightning>=2.0)", name="pytorch_lightning") from None

from smdebug import create_trial, modes
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.save_config import SaveConfig, SaveConfigMode

from .callback import DebuggerCallback

__all__ = ["DebuggerCallback", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode", "create_trial", "modes"]

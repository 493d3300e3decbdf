"""smdebug for the Hugging Face Trainer: ``from smdebug.transformers import DebuggerCallback``.

``Trainer(..., callbacks=[DebuggerCallback(out_dir=...)])`` saves weights, gradients,
losses and logged values with one smdebug step per optimizer step; it drives the PyTorch
hook (:class:`smdebug.pytorch.Hook`). Steps and what is saved:
:mod:`smdebug.transformers.callback`. With ``SMDEBUG_CONFIG_FILE_PATH`` set, an unmodified
script's Trainer gets the callback added (:mod:`smdebug.transformers._instrument`).
"""
try:
    import transformers  # noqa: F401 - fail here, naming the extra, if it is missing
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    if exc.name != "transformers":
        raise
    raise ModuleNotFoundError("smdebug.transformers needs Hugging Face transformers: pip install "
                              "'transformers>=5' accelerate (smdebug-core's 'transformers' extra)",
                              name="transformers") from None

from smdebug import create_trial, modes
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.save_config import SaveConfig, SaveConfigMode

from .callback import DebuggerCallback

__all__ = ["DebuggerCallback", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode", "create_trial", "modes"]

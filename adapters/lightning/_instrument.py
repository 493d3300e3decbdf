"""Zero code change for PyTorch Lightning: every Trainer gets a DebuggerCallback.

:func:`instrument` (called by :mod:`smdebug.zero_code_change` right after ``import
pytorch_lightning``) wraps ``Trainer.__init__``: once the Trainer is built, a
:class:`DebuggerCallback` without arguments (the hook configured by
``SMDEBUG_CONFIG_FILE_PATH``) is appended to its public ``trainer.callbacks`` list, unless
the script added one itself. The callback owns the process's PyTorch hook, so the PyTorch
instrumentor (which also runs, torch being imported) finds that hook owned and captures
nothing itself: one hook, one set of steps, per process.
"""
from __future__ import annotations

import functools

from smdebug.instrumentation import Patches
from smdebug.logger import get_logger

logger = get_logger("smdebug.lightning")
_patches = Patches()
_warned = False


def instrument() -> None:
    """Wrap ``pytorch_lightning.Trainer.__init__`` (idempotent)."""
    import pytorch_lightning as pl

    with _patches.lock:
        if not _patches.has(pl.Trainer, "__init__"):
            _patches.replace(pl.Trainer, "__init__", _wrap_init)


def uninstrument() -> None:
    """Put ``Trainer.__init__`` back (callbacks already added stay with their Trainers)."""
    with _patches.lock:
        _patches.restore()


def _wrap_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            _add_callback(self)
        except Exception as exc:  # noqa: BLE001 - zero code change never stops a script
            global _warned
            if not _warned:
                _warned = True
                logger.warning("smdebug: zero code change could not add its callback to the Lightning Trainer; "
                               "training runs without capture: %s: %s", type(exc).__name__, exc)

    return __init__


def _add_callback(trainer) -> None:
    from .callback import DebuggerCallback

    if not any(isinstance(callback, DebuggerCallback) for callback in trainer.callbacks):
        trainer.callbacks.append(DebuggerCallback())
        logger.info("smdebug: zero code change added a DebuggerCallback to the Lightning Trainer")

"""Zero code change for the Hugging Face Trainer: every Trainer gets a DebuggerCallback.

:func:`instrument` runs once ``transformers.trainer`` is imported (the package imports it
lazily, at the first use of ``transformers.Trainer``; the entry point names that module)
and wraps ``Trainer.__init__``: once a Trainer is built, a :class:`DebuggerCallback`
without arguments (the hook configured by ``SMDEBUG_CONFIG_FILE_PATH``) is added through
the public ``trainer.add_callback`` and attached to ``trainer.model``, unless the script
added one itself. The callback owns the process's PyTorch hook, so the PyTorch
instrumentor captures nothing itself: one hook per process.
"""
from __future__ import annotations

import functools

from smdebug.instrumentation import Patches
from smdebug.logger import get_logger

logger = get_logger("smdebug.transformers")
_patches = Patches()
_warned = False


def instrument() -> None:
    """Wrap ``transformers.Trainer.__init__`` (idempotent)."""
    from transformers.trainer import Trainer

    with _patches.lock:
        if not _patches.has(Trainer, "__init__"):
            _patches.replace(Trainer, "__init__", _wrap_init)


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
                logger.warning("smdebug: zero code change could not add its callback to the Transformers Trainer; "
                               "training runs without capture: %s: %s", type(exc).__name__, exc)

    return __init__


def _add_callback(trainer) -> None:
    from .callback import DebuggerCallback

    if any(isinstance(callback, DebuggerCallback) for callback in trainer.callback_handler.callbacks):
        return
    callback = DebuggerCallback()
    trainer.add_callback(callback)
    callback.attach(trainer.model)  # its on_init_end has passed
    logger.info("smdebug: zero code change added a DebuggerCallback to the Transformers Trainer")

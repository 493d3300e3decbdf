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

from smdebug.logger import get_logger
from smdebug.pytorch.integration import TrainerInstrumentor

logger = get_logger("smdebug.transformers")


class TransformersInstrumentor(TrainerInstrumentor):
    framework = "Transformers"
    distribution = "transformers"
    supported = ((5,), None)  # the versions tested (tox env transformers)

    def trainer_class(self) -> type:
        from transformers.trainer import Trainer

        return Trainer

    def add_callback(self, trainer) -> None:
        from .callback import DebuggerCallback

        if any(isinstance(callback, DebuggerCallback) for callback in trainer.callback_handler.callbacks):
            return
        callback = DebuggerCallback()
        trainer.add_callback(callback)
        callback.attach(trainer.model)  # its on_init_end has passed
        logger.info("smdebug: zero code change added a DebuggerCallback to the Transformers Trainer")


INSTRUMENTOR = TransformersInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented

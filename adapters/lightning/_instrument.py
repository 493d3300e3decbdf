"""Zero code change for PyTorch Lightning: every Trainer gets a DebuggerCallback.

:func:`instrument` (called by :mod:`smdebug.capture.zero_code_change` right after ``import
pytorch_lightning``) wraps ``Trainer.__init__``: once the Trainer is built, a
:class:`DebuggerCallback` without arguments (the hook configured by
``SMDEBUG_CONFIG_FILE_PATH``) is appended to its public ``trainer.callbacks`` list, unless
the script added one itself. The callback owns the process's PyTorch hook, so the PyTorch
instrumentor (which also runs, torch being imported) finds that hook owned and captures
nothing itself: one hook, one set of steps, per process.
"""
from __future__ import annotations

import importlib

from smdebug.logger import get_logger
from smdebug.pytorch.integration import TrainerInstrumentor

logger = get_logger("smdebug.lightning")


class LightningInstrumentor(TrainerInstrumentor):
    framework = "Lightning"
    distribution = "pytorch-lightning"
    supported = ((2, 0), (3,))
    package = "pytorch_lightning"

    def trainer_class(self) -> type:
        return importlib.import_module(self.package).Trainer

    def add_callback(self, trainer) -> None:
        from .callback import DebuggerCallback

        if not any(isinstance(callback, DebuggerCallback) for callback in trainer.callbacks):
            trainer.callbacks.append(DebuggerCallback())
            logger.info("smdebug: zero code change added a DebuggerCallback to the Lightning Trainer")


INSTRUMENTOR = LightningInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented

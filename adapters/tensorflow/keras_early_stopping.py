"""Keras' ``EarlyStopping`` among ``fit``'s callbacks, recorded as part of the run.

The hook finds it beside itself in fit's callback list when training begins, notes the
global step each epoch ended at (where ``val_*`` logs are saved: the evaluation passes), and
records at the end of training what it monitored (the name ``fit``'s logs saved it under,
e.g. ``val_loss``), its patience, the best epoch's step and whether it stopped training.
"""
from __future__ import annotations

import keras

from smdebug.capture.early_stopping import EvaluationPasses, callbacks_beside


def _mode(stopping) -> str:
    """"min" or "max": Keras resolves ``mode="auto"`` into ``monitor_op`` when it first judges."""
    mode = getattr(stopping, "mode", None)
    if mode in ("min", "max"):
        return mode
    op = getattr(stopping, "monitor_op", None)
    if op is not None:
        return "max" if bool(op(1.0, 0.0)) else "min"
    return "max" if any(word in str(stopping.monitor) for word in ("acc", "auc")) else "min"


class KerasEarlyStopping:
    """The early stopping of the hook's current ``fit`` (none found: does nothing)."""

    def __init__(self, hook):
        self._hook = hook
        self._callbacks: list = []
        self._passes = EvaluationPasses()

    def begin(self) -> None:
        self._callbacks = callbacks_beside(self._hook, keras.callbacks.EarlyStopping)
        self._passes = EvaluationPasses()

    def epoch_end(self) -> None:
        if self._callbacks:
            self._passes.add(self._hook.global_step)

    def end(self) -> None:
        """Record the early stopping that stopped training, else the first one found."""
        if not self._callbacks:
            return
        stopping = next((c for c in self._callbacks if getattr(c, "stopped_epoch", 0) > 0), self._callbacks[0])
        self._passes.record_into(
            self._hook, framework="keras", mechanism="keras.callbacks.EarlyStopping", monitor=str(stopping.monitor),
            mode=_mode(stopping), patience=stopping.patience, passes_since_best=getattr(stopping, "wait", 0),
            stopped=getattr(stopping, "stopped_epoch", 0) > 0, best_value=getattr(stopping, "best", None),
            last_step=self._hook.global_step)
        self._callbacks = []

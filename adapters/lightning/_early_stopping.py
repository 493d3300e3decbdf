"""Lightning's ``EarlyStopping`` among ``trainer.callbacks``, recorded as part of the run.

The callback notes the global step of each check's metrics (a validation loop's last EVAL
step, where its metrics are saved; the epoch's last step for a check at the end of a
training epoch) and, when training ends, records what the first early stopping monitored
(``scalar/`` and the name ``self.log`` logged it under: the tensor the run saved), its patience, the best
check's step and whether it stopped training.
"""
from __future__ import annotations

from smdebug.capture.early_stopping import EvaluationPasses


def _stoppings(trainer) -> list:
    return list(getattr(trainer, "early_stopping_callbacks", None) or [])


def _checks_at_epoch_end(stopping) -> bool:
    """Where Lightning runs the check: at the training epoch's end, or after each validation
    (its setup resolves the default; before setup, a check after validation is the default)."""
    return bool(getattr(stopping, "_check_on_train_epoch_end", False))


class LightningEarlyStopping:
    """Follows the early stopping of one ``fit`` (none in the trainer: does nothing)."""

    def __init__(self):
        self._passes = EvaluationPasses()

    def begin(self) -> None:
        self._passes = EvaluationPasses()

    def validation_end(self, trainer, hook) -> None:
        stoppings = _stoppings(trainer)
        if stoppings and not _checks_at_epoch_end(stoppings[0]):
            self._passes.add(hook.global_step)

    def train_epoch_end(self, trainer, hook) -> None:
        stoppings = _stoppings(trainer)
        if stoppings and _checks_at_epoch_end(stoppings[0]):
            self._passes.add(hook.global_step)

    def end(self, trainer, hook) -> None:
        stoppings = _stoppings(trainer)
        if not stoppings:
            return
        stopping = stoppings[0]
        wait, patience = int(getattr(stopping, "wait_count", 0)), int(getattr(stopping, "patience", 0))
        best = getattr(stopping, "best_score", None)  # a tensor, a number or None
        best_value = best.item() if best is not None and hasattr(best, "item") else best
        self._passes.record_into(
            hook, framework="lightning", mechanism=f"{type(stopping).__module__}.{type(stopping).__qualname__}",
            monitor=f"scalar/{stopping.monitor}", mode=str(getattr(stopping, "mode", "min")), patience=patience,
            passes_since_best=wait, stopped=getattr(stopping, "stopped_epoch", 0) > 0 or wait >= patience,
            best_value=best_value, last_step=hook.global_step)

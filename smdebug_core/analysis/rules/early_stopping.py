"""Early stopping as the rules see it: the run's record of it (``trial.early_stopping()``).

Early stopping ends training a few evaluation passes after the best one, by design: the
validation loss has then stopped improving for ``patience`` passes, which is what Overfit,
Overtraining and LossNotDecreasing look for. When the run stopped in time, their finding is
reported as handled, not fired. "In time": at most :data:`IN_TIME_PASSES` passes after the
best, or at most :data:`IN_TIME_FRACTION` of the passes that led to the best, whichever is
more. A run that went on long past its best (no stop, or a patience longer than that) fires.
"""
from __future__ import annotations

from typing import Optional

IN_TIME_PASSES = 10
IN_TIME_FRACTION = 0.5


def stopped_in_time(record: Optional[dict]) -> bool:
    """Whether ``record`` says early stopping ended training soon after the best pass."""
    if not record or not record.get("stopped"):
        return False
    after, best = record.get("passes_after_best"), record.get("best_pass")
    if not isinstance(after, int):
        return False
    allowed = max(IN_TIME_PASSES, IN_TIME_FRACTION * (best + 1 if isinstance(best, int) else 0))
    return after <= allowed


def handled_message(record: Optional[dict], step: int) -> Optional[str]:
    """"handled: ..." for a finding at ``step`` that early stopping dealt with, else None."""
    if not stopped_in_time(record):
        return None
    best = record.get("best_value")
    value = f" {best:.6g}" if isinstance(best, (int, float)) else ""
    return (f"handled: early stopping ended training {record['passes_after_best']} passes after the best "
            f"(metric {record.get('monitor') or 'unknown'}{value} at step {record.get('best_step')})")


def monitored_series(record: Optional[dict]) -> Optional[str]:
    """The tensor name of the metric early stopping monitored, or None."""
    if not record:
        return None
    monitor = record.get("monitor")
    return monitor if isinstance(monitor, str) and monitor else None


class RunEarlyStopping:
    """A rule's access to the run's record: read through the rule's view, kept once found,
    looked for again every :attr:`LOOK_EVERY` steps until then (a run being followed writes it
    when training ends). ``enabled`` False: the rule ignores early stopping (SageMaker's)."""

    LOOK_EVERY = 100

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._record: Optional[dict] = None
        self._looks = 0

    def record(self, view) -> Optional[dict]:
        if not self.enabled or view is None:
            return None
        if self._record is None and self._looks % self.LOOK_EVERY == 0:
            self._record = view.early_stopping()
        self._looks += 1
        return self._record

"""What an adapter needs to record a training's early stopping (``Hook.record_early_stopping``).

Keras, Lightning and the Hugging Face Trainer run early stopping as a callback beside the
hook's. Each counts the evaluation passes since its best one (``wait``); the adapter knows
the global step each pass was saved at (:class:`EvaluationPasses`), so the best pass's step
follows: the pass ``wait`` passes before the last. XGBoost's hook builds its record itself
(``adapters/xgboost/_collect.py``): the booster knows its best round.
"""
from __future__ import annotations

import gc
import math
from typing import List, Optional


def callbacks_beside(owner, kind) -> list:
    """The instances of ``kind`` in the lists that hold ``owner`` (a trainer's callback list,
    which the hook's callback is in but cannot otherwise reach: Keras' ``CallbackList``, the
    Hugging Face ``CallbackHandler``). Empty when none."""
    found = []
    for holder in gc.get_referrers(owner):
        if isinstance(holder, list):
            found.extend(item for item in holder if isinstance(item, kind) and item not in found)
    return found


class EvaluationPasses:
    """The global steps of a training's evaluation passes, in order: the adapter adds one
    where the pass's metrics were saved. ``record`` turns an early-stopping callback's count
    of passes since its best into the record ``Hook.record_early_stopping`` takes."""

    def __init__(self):
        self.steps: List[int] = []

    def add(self, global_step: int) -> None:
        if global_step >= 0 and (not self.steps or self.steps[-1] != global_step):
            self.steps.append(int(global_step))

    def record_into(self, hook, **fields) -> None:
        """``hook.record_early_stopping`` of :meth:`record`'s record (``fields``: its
        arguments), once an evaluation pass was seen."""
        record = self.record(**fields)
        if record is not None:
            hook.record_early_stopping(**record)

    def record(self, *, framework: str, mechanism: str, monitor: str, mode: str, patience: int,
               passes_since_best: int, stopped: bool, best_value=None, last_step: Optional[int] = None) -> Optional[dict]:
        """The early-stopping record, or None when no evaluation pass was seen."""
        if not self.steps:
            return None
        since = min(max(int(passes_since_best), 0), len(self.steps) - 1)
        best_pass = len(self.steps) - 1 - since
        try:
            best = float(best_value) if best_value is not None else None
        except (TypeError, ValueError):
            best = None
        if best is not None and not math.isfinite(best):
            best = None  # not judged yet (Keras starts from inf)
        return {"framework": framework, "mechanism": mechanism, "monitor": monitor, "mode": mode,
                "patience": int(patience), "best_step": self.steps[best_pass], "best_pass": best_pass,
                "best_value": best, "stopped_step": max(self.steps[-1], last_step or -1),
                "passes_after_best": since, "stopped": bool(stopped)}

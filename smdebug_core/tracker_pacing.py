"""How often a tracker sink sends per-layer statistics, so that its thread stays within a
share of the time between training steps.

A W&B row with a few histograms costs its thread about 1-3 ms of Python (serialization), and
that thread competes with training for the GIL and the cores. :class:`StatisticsPacing`
measures the thread's CPU time per step that carried statistics and the time between steps,
and sends the statistics of every ``every``-th step only, ``every`` a power of two chosen
after each batch so that ``cost / every <= budget * interval``. Nothing is averaged away:
a step that is not sent folds its statistics into the next one that is, keeping each layer's
most extreme value (largest magnitude; NaN and Inf win), so a one-step spike still shows at
the step that stands for it. Scalars (losses, metrics) are sent at every step.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np

from .trackers import LayerValues, StepPoints

#: The share of step time a tracker sink's thread may use by default.
DEFAULT_COST_BUDGET = 0.02
#: The most steps one sent step of statistics stands for.
MAX_EVERY = 1024
_SMOOTHING = 0.3  # weight of the newest batch in the running estimates


def more_extreme(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Elementwise, the value of larger magnitude; a non-finite value wins over a finite one."""
    take_new = ~np.isfinite(new) | (np.isfinite(old) & (np.abs(new) > np.abs(old)))
    return np.where(take_new, new, old)


class StatisticsPacing:
    """Chooses which steps' statistics a sink sends (see the module); ``budget`` None: all."""

    def __init__(self, budget: Optional[float]):
        if budget is not None and not (isinstance(budget, (int, float)) and 0 < budget < 1):
            raise ValueError(f"cost_budget must be a number in (0, 1) (a share of step time, e.g. 0.02) or None, "
                             f"got {budget!r}")
        self.budget = budget
        self.every = 1
        self.folded = 0  # per-layer values folded into a later step's
        self._seen = 0
        self._cost: Optional[float] = None  # thread seconds per step that carried statistics
        self._interval: Optional[float] = None  # seconds between steps: the median of the last ones,
        self._intervals: Deque[float] = deque(maxlen=64)  # which an evaluation or checkpoint pause does not move
        self._last_arrival: Optional[float] = None
        self._pending: Dict[Tuple[str, str], LayerValues] = {}  # (mode, statistic) -> folded so far
        self._last: Optional[StepPoints] = None

    def thin(self, batch: List[StepPoints], final: bool = False) -> None:
        """Fold the statistics of the steps not sent into the next step sent (in place). With
        ``final`` (the sink closes), what is still folded goes with the batch's last step."""
        if self.budget is None:
            return
        for points in batch:
            self._seen += 1
            if points.stats and self._seen % self.every:
                self._fold(points)
            elif self._pending:
                self._release(points)
        if final and self._pending:
            if not batch and self._last is not None:
                batch.append(StepPoints(self._last.step, self._last.mode))
            if batch:
                self._release(batch[-1], every_mode=True)
        if batch:
            self._last = batch[-1]

    def measured(self, batch: List[StepPoints], seconds: float) -> None:
        """The thread spent ``seconds`` sending ``batch``: update the estimates and ``every``."""
        if self.budget is None or not batch:
            return
        with_stats = sum(1 for p in batch if p.stats)
        if with_stats:
            self._cost = self._smooth(self._cost, seconds / with_stats)
        for arrived in (p.arrived for p in batch if p.arrived):
            if self._last_arrival is not None and arrived > self._last_arrival:
                self._intervals.append(arrived - self._last_arrival)
            self._last_arrival = arrived
        if self._intervals:
            self._interval = float(np.median(self._intervals))
        if self._cost is not None and self._interval:
            need = self._cost / (self.budget * self._interval)
            self.every = int(min(MAX_EVERY, 2 ** max(0, math.ceil(math.log2(need))))) if need > 1 else 1

    @staticmethod
    def _smooth(old: Optional[float], new: float) -> float:
        return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new

    def _fold(self, points: StepPoints) -> None:
        for stat, layers in points.stats.items():
            key = (points.mode, stat)
            had = self._pending.get(key)
            if had is not None and had.tensors == layers.tensors:
                layers = LayerValues(layers.tensors, more_extreme(had.values, layers.values))
            self._pending[key] = layers
            self.folded += len(layers.tensors)
        points.stats = {}

    def _release(self, points: StepPoints, every_mode: bool = False) -> None:
        for (mode, stat), folded in list(self._pending.items()):
            if mode != points.mode and not every_mode:
                continue
            del self._pending[(mode, stat)]
            mine = points.stats.get(stat)
            if mine is not None and mine.tensors == folded.tensors:
                folded = LayerValues(folded.tensors, more_extreme(folded.values, mine.values))
            points.stats[stat] = folded

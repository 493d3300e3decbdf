"""Which steps a tracker sink sends, so that sending stays within a share of step time.

Every W&B row costs about 0.2 ms of the sink thread's Python and twice that in wandb's own
threads, a few histograms 1-3 ms more, and all of it competes with training for the GIL and
the cores. :class:`Pacing` measures what sending costs per step against the time between
steps, and past ``budget`` cuts the steps into bins of ``every`` steps (a power of two,
doubled or halved after each batch). Of each bin it sends only the steps where a scalar
reached its minimum or its maximum over the bin, with their real step and value (as ``smdebug
export`` keeps each bin's extremes), and the per-layer statistics of the whole bin folded into
the bin's last row sent: each layer's most extreme value (largest magnitude; NaN and Inf
win), so a one-step spike still shows. Within the budget every step goes as it is.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np

from .trackers import LayerValues, StepPoints

#: The share of step time a tracker sink may use by default.
DEFAULT_COST_BUDGET = 0.02
#: The most steps one bin holds (a step's values wait at most this many steps to be sent).
MAX_EVERY = 1024


def more_extreme(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Elementwise, the value of larger magnitude; a non-finite value wins over a finite one."""
    take_new = ~np.isfinite(new) | (np.isfinite(old) & (np.abs(new) > np.abs(old)))
    return np.where(take_new, new, old)


def fold_statistics(bin_points: List[StepPoints]) -> Dict[str, LayerValues]:
    """The per-layer statistics of a bin's steps of one mode, each layer's most extreme value."""
    folded: Dict[str, LayerValues] = {}
    for points in bin_points:
        for stat, layers in points.stats.items():
            had = folded.get(stat)
            if had is not None and had.tensors == layers.tensors:
                layers = LayerValues(layers.tensors, more_extreme(had.values, layers.values))
            folded[stat] = layers
    return folded


def extreme_steps(bin_points: List[StepPoints]) -> List[int]:
    """Positions in the bin of the steps where some scalar is at its minimum or maximum (the
    first such step; a non-finite value counts as an extreme), and of the bin's last step."""
    best: Dict[str, Tuple[float, int, float, int]] = {}  # name -> (low, at, high, at)
    chosen = {len(bin_points) - 1}
    for i, points in enumerate(bin_points):
        for name, value in points.scalars:
            if not math.isfinite(value):
                chosen.add(i)
                continue
            low, low_at, high, high_at = best.get(name, (math.inf, -1, -math.inf, -1))
            if value < low:
                low, low_at = value, i
            if value > high:
                high, high_at = value, i
            best[name] = (low, low_at, high, high_at)
    for _, low_at, _, high_at in best.values():
        chosen.update(at for at in (low_at, high_at) if at >= 0)
    return sorted(chosen)


class Pacing:
    """Chooses the steps a sink sends (see the module). ``budget`` None: every step.
    ``helper_cost``: the tool's own work per unit of the sink thread's (W&B: its threads
    serialize and write each row too); what the sink thread measures is scaled by ``1 + helper_cost``."""

    def __init__(self, budget: Optional[float], helper_cost: float = 0.0):
        if budget is not None and not (isinstance(budget, (int, float)) and 0 < budget < 1):
            raise ValueError(f"cost_budget must be a number in (0, 1) (a share of step time, e.g. 0.02) or None, "
                             f"got {budget!r}")
        self.budget = budget
        self.helper_cost = helper_cost
        self.every = 1
        self.folded = 0  # values not sent at their own step (scalars left out of a bin, statistics folded)
        self._held: List[StepPoints] = []  # the open bin
        self._intervals: Deque[float] = deque(maxlen=64)  # seconds between steps; their median is
        self._last_arrival: Optional[float] = None  # not moved by an evaluation or checkpoint pause

    def thin(self, batch: List[StepPoints], final: bool = False) -> List[StepPoints]:
        """The steps of ``batch`` to send now: every one within the budget; else the extremes
        of each bin that is complete (with ``final``, the sink closes: the open one too)."""
        for arrived in (p.arrived for p in batch if p.arrived):
            if self._last_arrival is not None and arrived > self._last_arrival:
                self._intervals.append(arrived - self._last_arrival)
            self._last_arrival = arrived
        if self.budget is None or (self.every == 1 and not self._held):
            return batch
        out: List[StepPoints] = []
        for points in batch:
            self._held.append(points)
            if len(self._held) >= self.every:
                out += self._close_bin()
        if final and self._held:
            out += self._close_bin()
        return out

    def measured(self, steps: int, seconds: float) -> None:
        """The sink's thread spent ``seconds`` on a batch of ``steps`` steps: adjust ``every``."""
        if self.budget is None or not steps or not self._intervals:
            return
        share = seconds * (1 + self.helper_cost) / (steps * float(np.median(self._intervals)))
        if share > self.budget:
            self.every = min(MAX_EVERY, self.every * 2 ** math.ceil(math.log2(share / self.budget)))
        elif share < self.budget / 4 and self.every > 1:  # hysteresis: halve only when well under
            self.every //= 2

    def _close_bin(self) -> List[StepPoints]:
        held, self._held = self._held, []
        out: List[StepPoints] = []
        for mode in dict.fromkeys(p.mode for p in held):
            mine = [p for p in held if p.mode == mode]
            keep = extreme_steps(mine)
            statistics = fold_statistics(mine)
            for i, points in enumerate(mine):
                if i in keep:
                    out.append(points)
                else:
                    self.folded += len(points)
            for i in keep[:-1]:  # their statistics are in the bin's last row sent
                self.folded += sum(len(v.tensors) for v in mine[i].stats.values())
                mine[i].stats = {}
            mine[keep[-1]].stats = statistics
        out.sort(key=lambda p: p.arrived)
        return out

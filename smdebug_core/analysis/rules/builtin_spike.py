"""LossSpike: a training loss far above its recent level, and the layer that moved first.

Not a SageMaker Debugger rule (its parameters are ours). A loss spike is the most common
failure of large-model training: one bad batch, an optimizer state blow-up or a too-large
learning rate step throws the loss up by several times; the cause is usually visible a step
earlier as a jump in one layer's gradient norm or update size.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...modes import ModeKeys
from ...collections import UPDATE_PREFIX
from . import _params as P
from .actions import DumpFlightRecorder
from .builtin_training import _read_losses, _split_by_series, loss_names, loss_requirements
from ..trials.health import weight_update_ratio
from .culprit import culprit
from .findings import TRAINING_MODES
from .rule import DATA_MISSING, Rule



def _median(values) -> float:
    """``np.median`` of a short window of floats, without numpy's per-call cost where no NaN
    makes the order undefined (the same arithmetic: the middle one, or the mean of two)."""
    if not values or any(v != v for v in values):
        return float(np.median(np.asarray(values, dtype=np.float64)))
    ordered = sorted(values)
    n = len(ordered)
    middle = n // 2
    return float(ordered[middle]) if n % 2 else float((ordered[middle - 1] + ordered[middle]) / 2)


class LossSpike(Rule):
    """Fires when a training loss rises above ``factor`` (3.0) times its rolling median.

    The median is over the loss's previous ``window`` (20) saved training values (at least
    ``window // 2`` of them are needed). So that a converged loss's harmless batch-to-batch
    ratios (0.05 after a median of 0.005) do not count, the rise must also exceed
    ``min_rise_fraction`` (0.1) of the loss's first value and ``min_zscore`` (6.0) robust
    standard deviations of the window (1.4826 x its median absolute deviation), and be at
    least ``max_rise_factor`` (2.0) times the largest rise above the median the window has
    seen (small batches have heavy tails: a loss that reached 1.2 twice in 20 steps is not
    spiking when it reaches 1.24). A batch that is merely harder than most is not a spike.
    Consecutive spiking steps are one spike; each is reported.

    Attribution: for each spike, over the ``lookback`` (5) steps up to it, every layer's
    update ratio (its ``update/<weight>`` tensor, else the change of the weight between saved
    steps, over the weight's norm) and gradient L2 norm are compared with their own median
    over the ``window`` steps before; the culprit is the tensor whose jump (value / median)
    exceeded ``factor`` at the earliest step, the largest such jump at that step. It needs
    the run's weights or updates and gradients at consecutive steps; without them the spike
    is still reported, naming the loss.

    ``dump_flight_recorder`` (True): add a DumpFlightRecorder action, which, live
    (``hook.add_rule``), writes the steps the flight recorder kept before the spike.
    """

    reads_what = ("scalar losses; for attribution, gradient L2 norms (values or saved 'l2') and update/<weight> "
                  'tensors or weights')

    measure_name = "loss / rolling median"

    def __init__(self, base_trial=None, factor=3.0, window=20, min_rise_fraction=0.1, min_zscore=6.0, lookback=5,
                 tensor_regex=None, dump_flight_recorder=True, max_rise_factor=2.0, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.factor = P.number(self.rule_name, "factor", factor, minimum=1, exclusive_minimum=True)
        self.window = P.number(self.rule_name, "window", window, minimum=2, integer=True)
        self.min_rise_fraction = P.number(self.rule_name, "min_rise_fraction", min_rise_fraction, minimum=0)
        self.min_zscore = P.number(self.rule_name, "min_zscore", min_zscore, minimum=0)
        self.lookback = P.number(self.rule_name, "lookback", lookback, minimum=0, integer=True)
        self.max_rise_factor = P.number(self.rule_name, "max_rise_factor", max_rise_factor, minimum=0)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.dump_flight_recorder = P.boolean(self.rule_name, "dump_flight_recorder", dump_flight_recorder)
        if self.dump_flight_recorder and not any(isinstance(a, DumpFlightRecorder) for a in self.actions):
            self.actions.append(DumpFlightRecorder())
        self._losses: Dict[str, deque] = {}
        self._first: Dict[str, float] = {}
        # Live rules have no trial to read back: the per-step norms are kept as they come.
        self._live_norms: deque = deque(maxlen=self.window + self.lookback + 2)

    def required_tensors(self, step):
        if self.view.mode not in TRAINING_MODES:
            return ()
        return loss_requirements((), self.tensor_regex, not self.tensor_regex)

    def invoke_at_step(self, step):
        view = self.view
        if view.mode not in TRAINING_MODES:
            return False
        if self.live:
            self._live_norms.append((step, self._norms_now()))
        names = loss_names(view, (), self.tensor_regex, not self.tensor_regex)
        if not names:
            self.no_data(self.saved_elsewhere("losses", collection="losses"))
            return False
        fired = False
        for key, (train, _) in _split_by_series(view, _read_losses(self, names)).items():
            if not train:
                continue
            value = float(np.mean(train))
            history = self._losses.setdefault(key, deque(maxlen=self.window))
            first = self._first.setdefault(key, value)
            spike = False
            if len(history) >= max(2, self.window // 2):
                median = _median(history)
                spread = 1.4826 * _median([abs(v - median) for v in history])  # robust sigma
                rise = value - median
                spike = (value > self.factor * median and rise > self.min_rise_fraction * abs(first)
                         and rise > self.min_zscore * spread
                         and rise > self.max_rise_factor * (max(history) - median))
            start = self.streak_start(key, spike)
            history.append(value)
            if not spike:
                continue
            fired = True
            ratio = value / median if median > 0 else float("inf")
            found = self._attribute(start) if start == step else self._culprits.get(key)
            self._culprits[key] = found
            where = f"; {found['layer']} moved first: {found['why']}" if found else ""
            self.note(f"loss {key} {value:.6g} is {ratio:.3g}x its rolling median {median:.6g} (> {self.factor:g}x) "
                      f"since step {start}{where}", measure=ratio,
                      culprit=found or culprit(key, start, why="no layer's update or gradient jumped before it"),
                      **{key: {"value": value, "median": median, "first_step": start}})
        return fired

    @property
    def _culprits(self) -> Dict[str, Optional[dict]]:
        return self.__dict__.setdefault("_culprit_by_series", {})

    # --- attribution -----------------------------------------------------------------------
    def _norms_now(self) -> Dict[str, float]:
        """This step's gradient and update norms (live: kept for attribution; a live rule sees
        one step at a time, so without ``update/`` tensors only gradients attribute)."""
        out = {}
        view = self.view
        for name in view.tensor_names(collection="gradients", regex=(f"^{UPDATE_PREFIX}",)):
            try:
                out[name] = view.l2(name)
            except DATA_MISSING:
                continue
        return out

    def _history(self, spike_step: int) -> List[Tuple[int, Dict[str, object]]]:
        """``[(step, {tensor: gradient norm, update norm or weight value})]`` of the steps before
        the spike: read back from the run, or the live history."""
        if self.live:
            return [(s, dict(v)) for s, v in self._live_norms if s <= spike_step]
        view = self.view
        steps = [s for s in view.run_steps(ModeKeys.TRAIN) or view.run_steps()
                 if spike_step - self.window - self.lookback - 1 <= s <= spike_step]
        names = view.run_tensor_names(collection="gradients")
        updates = view.run_tensor_names(regex=f"^{UPDATE_PREFIX}")
        weights = [] if updates else \
            [n for n in view.run_tensor_names(collection="weights") if not n.startswith(UPDATE_PREFIX)]
        out = []
        for s in steps:
            at = view.at_step(s)
            values: Dict[str, object] = {}
            for name in names + updates + weights:
                try:
                    values[name] = np.asarray(at.value(name), dtype=np.float64) if name in weights else at.l2(name)
                except DATA_MISSING:
                    continue
            out.append((s, values))
        return out

    def _attribute(self, spike_step: int) -> Optional[dict]:
        """The tensor whose gradient norm or update ratio jumped first before the spike."""
        history = self._history(spike_step)
        if len(history) < 3:
            return None
        series: Dict[str, List[Tuple[int, float]]] = {}
        for i, (step, values) in enumerate(history):
            for name, value in values.items():
                if isinstance(value, np.ndarray):  # a weight: its update ratio, credited to the earlier step
                    if i + 1 < len(history) and name in history[i + 1][1]:
                        after = history[i + 1][1][name]
                        if isinstance(after, np.ndarray) and after.shape == value.shape:
                            ratio = weight_update_ratio(value, after, 1e-12)
                            series.setdefault(f"update of {name}", []).append((step, ratio))
                    continue
                series.setdefault(name, []).append((step, float(value)))
        jumps: List[Tuple[int, float, str]] = []
        for name, points in series.items():
            for i, (step, value) in enumerate(points):
                if step < spike_step - self.lookback or i < 2:
                    continue
                before = [v for s, v in points[max(0, i - self.window):i]]
                median = float(np.median(before))
                jump = value / median if median > 0 else (float("inf") if value > 0 else 0.0)
                if np.isfinite(value) and jump > self.factor:
                    jumps.append((step, jump, name))
        if not jumps:
            return None
        earliest = min(step for step, _, _ in jumps)
        at_first = [(jump, name) for step, jump, name in jumps if step == earliest]
        order = self.view.model_order()  # the largest jump; of equal ones, the first in model order
        jump, name = min(at_first, key=lambda jn: (-jn[0], order.key(jn[1].replace("update of ", ""))))
        tensor = name.replace("update of ", "")
        what = "update ratio" if name.startswith("update of ") or name.startswith(UPDATE_PREFIX) else "gradient norm"
        return culprit(tensor, earliest, jump=jump,
                       why=f"its {what} jumped {jump:.3g}x its median at step {earliest}")


__all__ = ["LossSpike"]

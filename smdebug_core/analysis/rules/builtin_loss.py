"""LossNotDecreasing: SageMaker's documented rule, and the trend test the default set runs.

Constructed as SageMaker Debugger's documentation shows (``LossNotDecreasing(trial)``,
``LossNotDecreasing(trial, num_steps=10, diff_percent=20)``) the rule behaves as documented:
every ``num_steps`` steps it compares the loss now with the loss ``num_steps`` earlier, point
to point. The trust tuning (warm-up, convergence, the loss's own noise, early stopping) is
parameters, all off by default; the default set of ``smdebug rules`` turns them on
(:data:`~.builtin.TRUSTED_PARAMETERS`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ...exceptions import ConfigError
from ...modes import ModeKeys
from . import _params as P
from .builtin_training import (_LossRule, _read_losses, loss_names, loss_requirements, monitored_requirements,
                               series_of, with_monitored)
from .culprit import culprit
from .early_stopping import monitored_series

#: Standard errors a trend's confidence bound lies from its estimate (about 95%, one-sided 97.5%).
_CONFIDENCE_Z = 2.0


def trend_drop(steps: np.ndarray, values: np.ndarray) -> Tuple[float, float]:
    """``(fitted drop, its standard error)`` of ``values`` over the span of ``steps``: the
    least-squares line's fall from the first step to the last (negative when it rose)."""
    x = steps - steps.mean()
    sxx = float(x @ x)
    centred = values - values.mean()
    slope = float(x @ centred) / sxx
    residuals = centred - slope * x
    dof = max(len(values) - 2, 1)
    slope_se = float(np.sqrt((residuals @ residuals) / dof / sxx))
    span = float(steps[-1] - steps[0])
    return -slope * span, slope_se * span


class _Series:
    """One loss series (a name in a mode): its values since the oldest step a check reads."""

    __slots__ = ("steps", "values", "start", "start_values", "last_check")

    def __init__(self, step: int):
        self.steps: List[int] = []
        self.values: List[float] = []
        self.start: Optional[float] = None  # the mean of the first window, once it is complete
        self.start_values: List[float] = []
        self.last_check = step

    def add(self, step: int, value: float, window: int) -> None:
        self.steps.append(step)
        self.values.append(value)
        if self.start is None:
            if step - self.steps[0] < window:
                self.start_values.append(value)
            else:
                self.start = float(np.mean(self.start_values))

    def start_mean(self) -> float:
        return self.start if self.start is not None else float(np.mean(self.start_values))

    def forget_before(self, step: int) -> None:
        """Drop the values before ``step``, keeping the latest of them (a point comparison's)."""
        cut = int(np.searchsorted(self.steps, step)) - 1
        if cut > 0:
            del self.steps[:cut]
            del self.values[:cut]


class LossNotDecreasing(_LossRule):
    """Fires when a loss has not decreased enough over ``num_steps`` steps.

    As SageMaker documents it (the defaults): every ``num_steps`` steps, counted in the
    loss's mode (at the first saved step at least ``num_steps`` after the previous check), the
    loss now is compared with the latest loss saved at least ``num_steps`` earlier; it fires
    when it fell by less than ``diff_percent`` percent of the earlier value (``diff_percent=0``:
    when it did not fall). Each mode's losses form their own series unless ``mode`` picks one.

    Trust tuning, off unless given (the default ``smdebug rules`` gives all of it):

    * ``warmup_steps``: no check before this mode step (the default set: 50; a loss may rise
      while Adam's moments and a schedule settle).
    * ``stall_margin``: judge the loss's trend against its own step-to-step noise instead of
      two points. At each check, a least-squares line is fitted to the values since the
      warm-up, over at most ``trend_windows`` windows of ``num_steps`` and at least
      ``stall_windows``; the loss counts as stalled only when, with about 95% confidence
      (2 standard errors of the fit), its fall over that span is less than ``stall_margin``
      times its level there (and less than ``diff_percent`` per window). A noisy loss that
      may be falling is not called stuck: the rule waits for the span to tell.
    * ``converged_fraction``: a stall that ends more than this fraction of the start's
      magnitude below the first window's mean is convergence, not a stuck loss.
    * ``follow_early_stopping``: when the run recorded an early-stopping mechanism, judge
      only the metric it monitored, and report a stall after the best that early stopping
      ended in time as handled (docs/rules.md, "Early stopping").

    Parameters (SageMaker's): ``collection_names``, ``tensor_regex``, ``use_losses_collection``
    (True), ``num_steps`` (10), ``diff_percent`` (0.0), ``mode`` (None: every mode). Ours:
    ``warmup_steps`` (0), ``stall_margin`` (None), ``stall_windows`` (3), ``trend_windows``
    (20), ``converged_fraction`` (None), ``follow_early_stopping`` (False).
    """

    reads_what = ("one number per loss and step: a scalar loss, else its mean (value or saved 'mean'); the metric "
                  'early stopping monitored')

    worst, measure_name = "min", "decrease %"

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, use_losses_collection=True,
                 num_steps=10, diff_percent=0.0, mode=None, warmup_steps=0, stall_margin=None, stall_windows=3,
                 trend_windows=20, converged_fraction=None, follow_early_stopping=False, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        rule = self.rule_name
        self.collection_names = P.str_list(rule, "collection_names", collection_names)
        self.tensor_regex = P.regex_list(rule, "tensor_regex", tensor_regex)
        self.use_losses_collection = P.boolean(rule, "use_losses_collection", use_losses_collection)
        if not (self.collection_names or self.tensor_regex or self.use_losses_collection):
            raise ConfigError(f"{rule}: with use_losses_collection=False give collection_names or "
                              "tensor_regex (the losses to watch)")
        self.num_steps = P.number(rule, "num_steps", num_steps, minimum=1, integer=True)
        self.diff_percent = P.number(rule, "diff_percent", diff_percent, minimum=0, maximum=100)
        self.mode = P.mode(rule, "mode", mode)
        self.warmup_steps = P.number(rule, "warmup_steps", warmup_steps, minimum=0, integer=True)
        self.stall_margin = P.number(rule, "stall_margin", stall_margin, minimum=0, allow_none=True)
        self.stall_windows = P.number(rule, "stall_windows", stall_windows, minimum=1, integer=True)
        self.trend_windows = P.number(rule, "trend_windows", trend_windows, minimum=self.stall_windows, integer=True)
        self.converged_fraction = P.number(rule, "converged_fraction", converged_fraction, minimum=0, maximum=1,
                                           allow_none=True)
        self._follow_early_stopping(follow_early_stopping)
        self._series: Dict[Tuple[str, ModeKeys], _Series] = {}

    def required_tensors(self, step):
        if self.mode is not None and self.view.mode is not self.mode:
            return ()
        return loss_requirements(self.collection_names, self.tensor_regex, self.use_losses_collection) + \
            monitored_requirements(monitored_series(self._stopping.record(self.view)), self.use_losses_collection)

    def invoke_at_step(self, step):
        view = self.view
        if self.mode is not None and view.mode is not self.mode:
            return False
        stopping = self._stopping.record(view)
        monitor = monitored_series(stopping)
        names = with_monitored(view, loss_names(view, self.collection_names, self.tensor_regex,
                                                self.use_losses_collection), monitor, self.use_losses_collection)
        self._warn_no_losses(names)
        if monitor is not None:
            names = self._monitored(names, monitor)
        now = view.mode_step
        fired = False
        for name, value in _read_losses(self, names).items():
            if not np.isfinite(value):
                continue  # NaN/inf is ExplodingTensor's finding, not a stall
            series = self._series.get((name, view.mode))
            if series is None:
                series = self._series[(name, view.mode)] = _Series(now)
            series.add(now, value, self.num_steps)
            if now - series.last_check < self.num_steps or now < self.warmup_steps:
                continue
            judge = self._judge_point if self.stall_margin is None else self._judge_trend
            finding = judge(series, now)
            if finding is None:
                continue
            message, measure, first, details = finding
            why = self._converged(series, details["to"])
            if why is not None:
                continue
            message = f"loss {name} ({view.mode.name}): {message}"
            if self._handled(message, step, stopping):
                continue
            fired = True
            self.note(message, measure=measure, culprit=culprit(name, first, why="the stall began here"),
                      **{name: details})
        return fired

    def _monitored(self, names: List[str], monitor: str) -> List[str]:
        """Of ``names``, the metric early stopping monitored, else those of its series (all
        when none matches: the losses are then judged as without early stopping)."""
        if monitor in names:
            return [monitor]
        wanted = series_of(monitor, ModeKeys.TRAIN)
        return [n for n in names if series_of(n, self.view.mode) == wanted] or names

    def _judge_point(self, series: _Series, now: int):
        """SageMaker's check: the loss now against the latest one ``num_steps`` back."""
        cutoff = now - self.num_steps
        index = int(np.searchsorted(series.steps, cutoff, side="right")) - 1
        if index < 0:
            return None
        series.last_check = now
        before_step, before = series.steps[index], series.values[index]
        value = series.values[-1]
        series.forget_before(cutoff)
        decrease = before - value
        if decrease > 0 and decrease >= self.diff_percent / 100.0 * abs(before):
            return None
        percent = 100.0 * decrease / abs(before) if before else 0.0
        message = (f"{before:.6g} at step {before_step}, {value:.6g} at step {now} ({percent:+.3g}%): less than "
                   f"the required {self.diff_percent:g}% decrease")
        return message, percent, before_step, {"from_step": before_step, "from": before, "to_step": now,
                                               "to": value}

    def _judge_trend(self, series: _Series, now: int):
        """The trend test (see the class docstring): a finding when the loss is stalled."""
        first = max(self.warmup_steps, now - self.trend_windows * self.num_steps)
        series.forget_before(first)
        steps = np.asarray(series.steps, dtype=np.float64)
        keep = steps >= first
        steps, values = steps[keep], np.asarray(series.values, dtype=np.float64)[keep]
        if len(steps) < 4 or steps[-1] - steps[0] < self.stall_windows * self.num_steps:
            return None  # too short a span to tell a stall from noise
        series.last_check = now
        drop, error = trend_drop(steps, values)
        level = float(np.mean(values))
        windows = (steps[-1] - steps[0]) / self.num_steps
        required = max(self.stall_margin, self.diff_percent / 100.0 * windows) * abs(level)
        most = drop + _CONFIDENCE_Z * error
        if most >= required:
            return None  # it may be falling by enough: its noise hides the trend so far
        span = f"steps {int(steps[0])}-{now}"
        percent = 100.0 * drop / abs(level) if level else 0.0
        message = (f"over {span} it fell by {drop:.3g} ({percent:+.3g}% of its level {level:.6g}; at most "
                   f"{most:.3g} at 95% confidence, against its step-to-step noise): less than the required "
                   f"{100.0 * required / abs(level) if level else 0.0:.3g}%")
        return message, percent, int(steps[0]), {"from_step": int(steps[0]), "to_step": now, "drop": drop,
                                                 "drop_bound": most, "level": level, "to": level}

    def _converged(self, series: _Series, value: float) -> Optional[str]:
        """Why a stalled loss is fine (it converged far below its start), or None."""
        if self.converged_fraction is None:
            return None
        start = series.start_mean()
        if start and start - value >= self.converged_fraction * abs(start):
            return "far below its start"
        return None

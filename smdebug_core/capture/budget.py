"""The overhead budget: the hook keeps its own cost within a stated fraction of step time.

``overhead_budget`` (a hook argument, the JSON config's ``HookParameters.overhead_budget``,
``$SMDEBUG_OVERHEAD_BUDGET``) is a number in (0, 1), e.g. ``0.02`` for 2%. Unset, nothing here
runs and the save configs mean what they always meant. Set:

* the adapter charges the time the training thread spends in the hook's frames
  (:meth:`OverheadBudget.timed`, :meth:`OverheadBudget.charge`); the hook's background threads'
  CPU (the step pipeline, the writer) is read from their thread clocks and counted as far as
  it competes with training for cores (``competition``); the step's own time is the time
  between step boundaries less the hook's;
* at fixed decision steps (every :data:`DECISION_PERIOD` global steps) the costs of the last
  window, per step that saved an expensive collection and per step that did not, are agreed
  across ranks (their maximum, through the adapter's ``agree``: one tiny all-reduce), and
  the *level* is set: each expensive collection is saved every ``configured interval * 2**level``
  mode steps, the smallest level whose predicted cost fits the budget. It rises as far as
  needed at once when over and falls only with a margin (:data:`LOWER_MARGIN`), so that it
  does not flap. Every rank computes the same level from the same agreed numbers, so every
  rank saves the same steps (sharded tensors' collectives need that);
* cheap collections (:data:`CHEAP_COLLECTIONS`: losses, metrics, scalars) keep their interval;
  explicit ``save_steps`` stay saved.

Which steps are saved then depends on timing. What it did is recorded as scalars at each
decision step (:data:`SCALAR_PREFIX`): the agreed measured cost, the budget and each
expensive collection's effective interval; the Trial reads them back (analysis/trials/budget_view.py).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from ..collections import RAW_ONLY_COLLECTIONS
from ..exceptions import ConfigError
from ..logger import get_logger
from ..save_config import DEFAULT_SAVE_INTERVAL

logger = get_logger()

#: The environment variable read when the hook argument is not given.
BUDGET_ENV = "SMDEBUG_OVERHEAD_BUDGET"
#: Scalars ``<prefix>/measured``, ``<prefix>/budget``, ``<prefix>/every/<collection>``.
SCALAR_PREFIX = "overhead_budget"
#: Global steps between two decisions (and the first decision's step).
DECISION_PERIOD = 20
#: The first steps of a run are not measured: plans, allocations and caches are made there.
SETTLING_STEPS = 2
#: The largest factor an interval is multiplied by, unless the setting says otherwise.
MAX_FACTOR = 1024
#: The level falls only to one whose predicted cost is within this share of the budget.
LOWER_MARGIN = 0.7
#: Collections whose interval the budget never changes: a few numbers each per step.
CHEAP_COLLECTIONS = frozenset(RAW_ONLY_COLLECTIONS)
_UNKNOWN = -1.0  # a cost no step of the window measured; the agreed maximum ignores it


@dataclass(frozen=True)
class BudgetSetting:
    """``fraction``: the share of step time the hook may add, in (0, 1). ``max_factor``: the
    most an expensive collection's interval is multiplied by (a power of two)."""

    fraction: float
    max_factor: int = MAX_FACTOR

    @property
    def max_level(self) -> int:
        return int(math.log2(self.max_factor))

    @classmethod
    def coerce(cls, value, where: str = "overhead_budget") -> Optional["BudgetSetting"]:
        """A setting from a number (or numeric string), a dict ``{"fraction", "max_factor"}``
        or a setting; None stays None. ConfigError naming the value and what is allowed."""
        if value is None or isinstance(value, cls):
            return value
        max_factor = MAX_FACTOR
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"fraction", "max_factor"})
            if unknown or "fraction" not in value:
                raise ConfigError(f"{where} as a dict takes 'fraction' (required) and 'max_factor', got {value!r}")
            max_factor = _power_of_two(value.get("max_factor", MAX_FACTOR), f"{where}.max_factor")
            value = value["fraction"]
        return cls(_fraction(value, where), max_factor)


def _fraction(value, where: str) -> float:
    allowed = (f"{where} must be a number in (0, 1), the share of step time the hook may add "
               f"(e.g. 0.02 for 2%), got {value!r}")
    if isinstance(value, bool):
        raise ConfigError(allowed)
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ConfigError(allowed) from None
    if not 0.0 < number < 1.0:  # NaN fails too
        raise ConfigError(allowed)
    return number


def _power_of_two(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ConfigError(f"{where} must be a power of two (1, 2, 4, ...), got {value!r}")
    return value


def resolve_budget(value) -> Optional[BudgetSetting]:
    """The hook argument, else ``$SMDEBUG_OVERHEAD_BUDGET``, else None (no budget)."""
    if value is not None:
        return BudgetSetting.coerce(value)
    raw = os.environ.get(BUDGET_ENV, "").strip()
    return BudgetSetting.coerce(raw, f"${BUDGET_ENV}") if raw else None


def background_cpu_seconds() -> float:
    """CPU seconds used so far by this process's smdebug threads (step pipeline, writer),
    from their thread clocks; 0 where the platform has none."""
    total = 0.0
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if getclock is None:
        return 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("smdebug") and thread.ident is not None:
            try:
                total += time.clock_gettime(getclock(thread.ident))
            except (OSError, ValueError, OverflowError):  # the thread ended meanwhile
                pass
    return total


@dataclass
class Decision:
    """One decision step: the local costs (fractions of step time), the agreed ones, the level."""

    global_step: int
    local: Sequence[float]
    agreed: Sequence[float]
    level: int

    @property
    def measured(self) -> float:
        """The window's cost, the ranks' maximum (a fraction of step time; -1: not measured)."""
        return self.agreed[2]


class _Window:
    """Costs of the steps since the last decision, split by whether they saved an expensive collection."""

    def __init__(self, background: float):
        self.saved_cost = self.plain_cost = 0.0
        self.saved_own = self.plain_own = 0.0
        self.saved_steps = self.plain_steps = 0
        self.background_start = background

    def add(self, saved: bool, cost: float, own: float) -> None:
        if saved:
            self.saved_cost, self.saved_own, self.saved_steps = \
                self.saved_cost + cost, self.saved_own + own, self.saved_steps + 1
        else:
            self.plain_cost, self.plain_own, self.plain_steps = \
                self.plain_cost + cost, self.plain_own + own, self.plain_steps + 1

    def fractions(self, background: float) -> List[float]:
        """``[saved step's cost, plain step's cost, the window's cost]`` as fractions of the
        mean own step time; background CPU goes to the saved steps, which cause it."""
        steps = self.saved_steps + self.plain_steps
        own = self.saved_own + self.plain_own
        if steps == 0 or own <= 0:
            return [_UNKNOWN, _UNKNOWN, _UNKNOWN]
        mean_own = own / steps
        saved_cost, plain_cost = self.saved_cost, self.plain_cost
        if self.saved_steps:
            saved_cost += background
        else:
            plain_cost += background
        return [saved_cost / self.saved_steps / mean_own if self.saved_steps else _UNKNOWN,
                plain_cost / self.plain_steps / mean_own if self.plain_steps else _UNKNOWN,
                (saved_cost + plain_cost) / own]


class OverheadBudget:
    """The budget controller of one hook (module docstring). The adapter charges its time,
    the session marks step boundaries and decision steps, the plans ask :meth:`keeps`.

    ``competition``: the share of background CPU that takes cores from training (1 when
    training uses every core, as CPU training does; less when it leaves cores idle).
    ``agree``: set by the adapter of a job with several ranks: the element-wise maximum of a
    list of floats over the ranks (one tiny all-reduce), called on the training thread at
    each decision step by every rank."""

    def __init__(self, setting: BudgetSetting, competition: float = 1.0,
                 background: Callable[[], float] = background_cpu_seconds):
        self.setting = setting
        self.competition = competition
        self.level = 0
        self.agree: Optional[Callable[[List[float]], List[float]]] = None
        #: Every decision, in order; ``changes`` lists those that changed the level.
        self.history: List[Decision] = []
        self.frozen = False  # the ranks could not agree once: the level stays where all ranks have it
        self._background = background
        self._charged = 0.0
        self._depth = 0
        self._entered = 0.0
        self._boundary: Optional[float] = None
        self._steps_seen = 0
        self._known = [_UNKNOWN, _UNKNOWN]  # the last agreed saved/plain step costs
        self._window = _Window(background())

    # --- what the adapter feeds it -----------------------------------------------------------
    def charge(self, seconds: float) -> None:
        """Count ``seconds`` of training-thread time (or device time) the hook added to the open step."""
        self._charged += seconds

    def enter(self) -> None:
        """The training thread enters the hook's frames (nested entries count once)."""
        if self._depth == 0:
            self._entered = time.perf_counter()
        self._depth += 1

    def leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._charged += time.perf_counter() - self._entered

    def timed(self):
        """``with budget.timed(): ...``: the block's time is the hook's."""
        return _Timed(self)

    # --- what the session calls ---------------------------------------------------------------
    def step_boundary(self, saved_expensive: bool) -> None:
        """The previous step ended and the next begins now (after the previous step's end was
        handed over): its time less the hook's is its own; ``saved_expensive``: it saved an
        expensive collection. Time the hook spends in frames still open counts from here on."""
        now = time.perf_counter()
        if self._depth:
            self._charged += now - self._entered
            self._entered = now
        if self._boundary is not None and self._steps_seen >= SETTLING_STEPS:
            cost = self._charged
            self._window.add(saved_expensive, cost, max(now - self._boundary - cost, 1e-9))
        self._steps_seen += 1
        self._boundary, self._charged = now, 0.0

    @staticmethod
    def decision_due(global_step: int) -> bool:
        return global_step > 0 and global_step % DECISION_PERIOD == 0

    def decide(self, global_step: int, base_interval: int) -> Optional[Decision]:
        """At a decision step, on every rank: agree on the window's costs and set the level.
        ``base_interval``: the smallest configured interval of the expensive collections.
        Returns the decision (None when the ranks could not agree: the level stays)."""
        if self.frozen:
            return None
        background = self._background()
        local = self._window.fractions(max(0.0, background - self._window.background_start) * self.competition)
        self._window = _Window(background)
        agreed = list(local)
        if self.agree is not None:
            try:
                agreed = [float(v) for v in self.agree(list(local))]
            except Exception as exc:  # noqa: BLE001 - a rank that cannot agree keeps the level all ranks have
                self.frozen = True
                logger.warning("smdebug overhead budget: the ranks could not agree on the hook's cost at step %d "
                               "(%s: %s); the save intervals stay as they are (every %dx the configured one)",
                               global_step, type(exc).__name__, exc, 1 << self.level)
                return None
        for i in (0, 1):
            if agreed[i] >= 0:
                self._known[i] = agreed[i]
        self.level = self._choose(max(1, base_interval))
        decision = Decision(global_step, local, agreed, self.level)
        self.history.append(decision)
        return decision

    def _choose(self, base_interval: int) -> int:
        saved, plain = self._known
        if saved < 0:
            return self.level  # no saved step measured yet: nothing to predict from
        plain = max(plain, 0.0)

        def predicted(level: int) -> float:
            return plain + (saved - plain) * min(1.0, 1.0 / (base_interval << level))

        def lowest(limit: float) -> int:
            return next((k for k in range(self.setting.max_level + 1) if predicted(k) <= limit),
                        self.setting.max_level)

        within = lowest(self.setting.fraction)
        if within > self.level:
            return within
        with_margin = lowest(LOWER_MARGIN * self.setting.fraction)
        return with_margin if with_margin < self.level else self.level

    # --- what the plans ask -----------------------------------------------------------------------
    @property
    def factor(self) -> int:
        return 1 << self.level

    def keeps(self, collection: str, mode_config, step: int) -> bool:
        """Whether ``collection``, whose save config ``mode_config`` saves mode step ``step``,
        still saves it at the current level."""
        if self.level == 0 or collection in CHEAP_COLLECTIONS:
            return True
        if step in (mode_config.save_steps or ()):
            return True
        return step % ((mode_config.save_interval or DEFAULT_SAVE_INTERVAL) << self.level) == 0

    def scalars(self, decision: Decision, intervals: Dict[str, int]) -> List[tuple]:
        """``(name, value)`` of the scalars that record ``decision`` (the intervals configured)."""
        out = [(f"{SCALAR_PREFIX}/budget", self.setting.fraction)]
        if decision.measured >= 0:
            out.append((f"{SCALAR_PREFIX}/measured", decision.measured))
        out += [(f"{SCALAR_PREFIX}/every/{name}", interval << decision.level) for name, interval in intervals.items()]
        return out


class _Timed:
    __slots__ = ("budget",)

    def __init__(self, budget: OverheadBudget):
        self.budget = budget

    def __enter__(self):
        self.budget.enter()
        return self

    def __exit__(self, *exc):
        self.budget.leave()
        return False

"""A run's steps as its index files name them: modes and mode steps, which workers wrote
each step, which steps are complete, and why a step asked for has no data.

The trial fills a :class:`StepIndex` while it registers index files; the trial, its
tensors and the bulk reader ask it about steps.
"""
from __future__ import annotations

import bisect
import enum
import logging
from operator import itemgetter
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from ...exceptions import NoMoreData, StepNotYetAvailable, StepUnavailable
from ...modes import ModeKeys
from ...storage.format.layout import validate_step

logger = logging.getLogger("smdebug.trials")

GLOBAL = ModeKeys.GLOBAL
_MODE_NUMBER = {m: m.value for m in ModeKeys}
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class StepState(enum.Enum):
    """Whether a step can be read now (``has_passed_step``)."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


def steps_text(steps: List[int]) -> str:
    """A list of steps for a message, shortened when long."""
    if not steps:
        return "none"
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:4]))}, ..., {', '.join(map(str, steps[-2:]))} ({len(steps)} steps)"


def step_positions(known: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Where each of ``steps`` (all loaded steps) is in the sorted ``known``: a lookup table
    when the steps are dense (a gather instead of a binary search per row), else a search."""
    if len(known) and len(steps) > 4096 and known[-1] - known[0] < 4 * len(known) + 4096:
        table = np.zeros(int(known[-1] - known[0]) + 1, np.int64)
        table[known - known[0]] = np.arange(len(known))
        return table[steps - known[0]]
    return np.searchsorted(known, steps)


class StepIndex:
    """The steps of a run, keyed by global step. Steps are only ever added, and a step's
    mode and mode step never change once registered (the first index file of a step wins).

    A step is *complete* once every worker wrote it, a later step is complete, or training
    ended (docs/format.md 5.3).
    """

    def __init__(self):
        self.global_to_mode: Dict[int, Tuple[ModeKeys, int]] = {}
        self.mode_to_global: Dict[ModeKeys, Dict[int, int]] = {}
        self.workers_for_step: Dict[int, Set[str]] = {}
        #: Global steps that workers number differently: ``{step: {worker: (mode, mode_step)}}``
        #: for the workers whose own numbering differs from the trial's (the first worker read).
        self.worker_step_conflicts: Dict[int, Dict[str, Tuple[ModeKeys, int]]] = {}
        self.last_complete_step = -1
        self.loaded_all_steps = False
        self.num_workers = 0
        self._sorted_steps: Optional[List[int]] = []
        self._sorted_mode_steps: Dict[ModeKeys, List[int]] = {}
        self._arrays = None  # (number of steps, arrays()) when last built

    # ------------------------------------------------------------------ registering
    def add(self, step: int, worker: str, mode: ModeKeys, mode_step: int, path: str) -> bool:
        """``worker`` saved ``step`` as ``mode_step`` of ``mode``; True if the step is new.
        ``path``: the run, for warnings."""
        is_new = step not in self.global_to_mode
        if is_new:
            self.global_to_mode[step] = (mode, mode_step)
            if mode is GLOBAL and mode_step != step:
                logger.warning(
                    "%s: step %d is in GLOBAL mode with mode_step %d; GLOBAL-mode data must have "
                    "mode_step == global step (docs/format.md 1.5)", path, step, mode_step,
                )
        if not is_new and self.global_to_mode[step] != (mode, mode_step):
            self._note_conflict(step, worker, mode, mode_step, path)  # not in the mode-step lookups
        elif mode is not GLOBAL:
            self.mode_to_global.setdefault(mode, {}).setdefault(mode_step, step)

        workers = self.workers_for_step.get(step)
        if workers is None:
            workers = self.workers_for_step[step] = set()
        workers.add(worker)
        if len(workers) >= self.num_workers and step > self.last_complete_step:
            self.last_complete_step = step
        return is_new

    def _note_conflict(self, step: int, worker: str, mode: ModeKeys, mode_step: int, path: str) -> None:
        """``worker`` saved global ``step`` as another mode step than the worker read first: a
        worker ran steps the others did not (evaluation on one rank only, say). Steps are
        shared by every worker in the format, so the trial keeps the first numbering for
        mode-based reads and this worker's own for its values (one warning per trial)."""
        if not self.worker_step_conflicts:
            first_mode, first_step = self.global_to_mode[step]
            logger.warning(
                "smdebug: workers number global step %d differently in %s: %s saved it as %s step %d, another "
                "worker as %s step %d (a worker ran steps the others did not, e.g. evaluation on one rank only). "
                "Mode steps follow the first worker read; each worker's values keep their own mode and mode step "
                "(to_dataframe, value(step, worker=...) with global steps); trial.worker_step_conflicts lists "
                "every such step. Running the same loops on every worker avoids it.",
                step, path, worker, mode.name, mode_step, first_mode.name, first_step)
        self.worker_step_conflicts.setdefault(step, {})[worker] = (mode, mode_step)

    def forget_sorted(self) -> None:
        """New steps were added: the sorted lists are built again when next asked for."""
        self._sorted_steps = None
        self._sorted_mode_steps.clear()

    def mark_ended(self, path: str) -> None:
        """Training ended: every step is known, and complete."""
        self.loaded_all_steps = True
        if self.global_to_mode:
            self.last_complete_step = max(self.last_complete_step, self.sorted_steps()[-1])
        logger.debug("%s: training has ended; %d steps loaded", path, len(self.global_to_mode))

    def apply_incomplete_step_window(self, window: int, path: str) -> None:
        """Stop waiting for the oldest stragglers once too many steps are incomplete (docs/format.md 5.3).

        While more than ``window`` steps wait, the oldest half-window of them is treated as
        complete. The original compared ``len(steps) - (last_complete_step + 1)`` with the
        window, which assumes every step is saved, and moved at most once per refresh; this
        counts the steps actually waiting, so the result does not depend on how often the
        trial was refreshed.
        """
        steps = self.sorted_steps()
        first_incomplete = bisect.bisect_right(steps, self.last_complete_step)
        waiting = len(steps) - first_incomplete
        if waiting <= window:
            return
        give_up = max(1, window // 2)
        while waiting > window:
            first_incomplete += give_up
            waiting -= give_up
        self.last_complete_step = steps[first_incomplete - 1]
        logger.info(
            "%s: more than INCOMPLETE_STEP_WAIT_WINDOW=%d steps are incomplete; "
            "treating steps up to %d as complete",
            path, window, self.last_complete_step,
        )

    # ------------------------------------------------------------------ asking
    def sorted_steps(self, mode: ModeKeys = GLOBAL) -> List[int]:
        """Every registered step: global steps for GLOBAL, else the mode's own numbers."""
        if mode is GLOBAL:
            if self._sorted_steps is None:
                self._sorted_steps = sorted(self.global_to_mode)
            return self._sorted_steps
        cached = self._sorted_mode_steps.get(mode)
        if cached is None:
            cached = self._sorted_mode_steps[mode] = sorted(self.mode_to_global.get(mode, ()))
        return cached

    def is_complete(self, global_step: int) -> bool:
        return (
            self.loaded_all_steps
            or global_step <= self.last_complete_step
            or len(self.workers_for_step.get(global_step, ())) >= self.num_workers
        )

    def known_global_step(self, mode: ModeKeys, mode_step: int) -> Optional[int]:
        if mode is GLOBAL:
            return mode_step if mode_step in self.global_to_mode else None
        return self.mode_to_global.get(mode, {}).get(mode_step)

    def state(self, step: int, mode: ModeKeys) -> StepState:
        g = self.known_global_step(mode, step)
        if g is not None:
            return StepState.AVAILABLE if self.is_complete(g) else StepState.NOT_YET_AVAILABLE
        if self.loaded_all_steps:
            return StepState.UNAVAILABLE
        # Absent: skipped if a later step of the mode is complete (a straggler would have
        # written it before), else it may still come.
        steps = self.sorted_steps(mode)
        later = bisect.bisect_right(steps, step)
        if later < len(steps):
            next_global = steps[later] if mode is GLOBAL else self.mode_to_global[mode][steps[later]]
            if next_global <= self.last_complete_step:
                return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE

    def hint(self, step: int, mode: ModeKeys, tensor_name: Optional[str] = None,
             tensor_steps: Optional[List[int]] = None, saved_at=None) -> str:
        """Where ``step`` does exist (another mode, the global numbering) and which steps
        ``mode`` has, for error messages. For a tensor: its name, its steps in ``mode`` and
        the global steps it was saved at (``saved_at``)."""
        parts = []
        if tensor_name is not None:
            parts.append(f"steps of {tensor_name!r} in mode {mode.name}: {steps_text(tensor_steps)}")
        else:
            parts.append(f"saved steps of mode {mode.name}: {steps_text(self.sorted_steps(mode))}")
        elsewhere = []
        for other, by_step in sorted(self.mode_to_global.items(), key=lambda kv: kv[0].value):
            g = by_step.get(step)
            if other is not mode and g is not None and (saved_at is None or g in saved_at):
                elsewhere.append(f"mode {other.name} has a step {step} (global step {g}): pass "
                                 f"mode=smd.modes.{other.name}")
        if mode is not GLOBAL and step in self.global_to_mode and (saved_at is None or step in saved_at):
            m, ms = self.global_to_mode[step]
            elsewhere.append(f"global step {step} is step {ms} of mode {m.name}: pass mode=smd.modes.GLOBAL")
        return "; " + "; ".join(parts + elsewhere)

    def raise_missing(self, step: int, mode: ModeKeys, trial_name: str):
        """Raise the exception that says why ``step`` of ``mode`` has no data."""
        state = self.state(step, mode)
        if state is StepState.NOT_YET_AVAILABLE:
            raise StepNotYetAvailable(f"step {step} of mode {mode.name} is not available yet in trial {trial_name!r}"
                                      + self.hint(step, mode))
        steps = self.sorted_steps(mode)
        if self.loaded_all_steps and (not steps or step > steps[-1]):
            last = steps[-1] if steps else None
            raise NoMoreData(
                f"training has ended; step {step} of mode {mode.name} was never saved "
                f"(last saved step of that mode: {last})" + self.hint(step, mode)
            )
        raise StepUnavailable(f"step {step} of mode {mode.name} was not saved in trial {trial_name!r}"
                              + self.hint(step, mode))

    def resolve(self, step, mode, refresh: Callable[[], None], trial_name: str) -> Tuple[int, ModeKeys, int]:
        """``(global_step, mode, step)`` for a step given in ``mode``'s numbering.

        For GLOBAL the global step is returned as is, known or not; for other modes an
        unknown mode step triggers ``refresh()`` and then the matching exception.
        """
        mode = ModeKeys.parse(mode)
        step = validate_step(step)
        if mode is GLOBAL:
            return step, mode, step
        g = self.known_global_step(mode, step)
        if g is None:
            refresh()
            g = self.known_global_step(mode, step)
            if g is None:
                self.raise_missing(step, mode, trial_name)
        return g, mode, step

    def arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(global steps, mode numbers, mode steps)`` of every registered step, as arrays
        sorted by step; kept until more steps are registered."""
        to_mode = self.global_to_mode
        n = len(to_mode)
        cached = self._arrays
        if cached is not None and cached[0] == n:
            return cached[1]
        steps = np.fromiter(to_mode, np.int64, n)
        pairs = list(to_mode.values())
        modes = np.fromiter(map(_MODE_NUMBER.__getitem__, map(_FIRST, pairs)), np.int64, n)
        mode_steps = np.fromiter(map(_SECOND, pairs), np.int64, n)
        if n > 1 and not (steps[1:] > steps[:-1]).all():  # loaded bucket by bucket: usually sorted already
            order = np.argsort(steps)
            steps, modes, mode_steps = steps[order], modes[order], mode_steps[order]
        table = (steps, modes, mode_steps)
        self._arrays = (n, table)
        return table

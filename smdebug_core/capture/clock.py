"""The run's step counters (docs/format.md 8.1): the global step, a counter per mode, and the
open step's identity. Owned by the step session (``session.clock``); only the training
thread changes them.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..logger import get_logger
from ..modes import ModeKeys

logger = get_logger()

#: (global step, mode, mode step)
Identity = Tuple[int, ModeKeys, int]


class StepClock:
    """Counts steps. A step keeps the mode it began in, even if the mode changes before it ends."""

    def __init__(self):
        self.mode = ModeKeys.GLOBAL
        self.global_step = -1
        self.mode_steps: Dict[ModeKeys, int] = {ModeKeys.GLOBAL: -1}
        #: The open (or last) step; scalars saved before any step go to step 0.
        self.identity: Identity = (0, ModeKeys.GLOBAL, 0)
        self.open = False
        self._warned_back: set = set()  # modes whose trainer step count went back (warned once)

    @property
    def mode_step(self) -> int:
        return self.mode_steps.get(self.mode, -1)

    @property
    def step_mode(self) -> ModeKeys:
        """The mode the open (or last) step began in."""
        return self.identity[1]

    def set_mode(self, mode: ModeKeys) -> None:
        self.mode_steps.setdefault(mode, -1)
        self.mode = mode

    def advance(self, step: Optional[int] = None) -> Identity:
        """Open the next step (or global step ``step``); returns its identity."""
        if step is None:
            self.global_step += 1
            self.mode_steps[self.mode] = self.mode_steps.get(self.mode, -1) + 1
        else:
            if step < 0:
                raise ValueError(f"step must be >= 0, got {step}")
            self.global_step = step
            self.mode_steps[self.mode] = step if self.mode == ModeKeys.GLOBAL else self.mode_step + 1
        self.mode_steps[ModeKeys.GLOBAL] = self.global_step
        self.identity = (self.global_step, self.mode, self.mode_step)
        self.open = True
        return self.identity

    def continue_mode_steps(self, mode: ModeKeys, next_step: int) -> None:
        """Number the next step of ``mode`` ``next_step`` (a trainer that resumed from a
        checkpoint numbers its steps on from there); the global step counts on as usual."""
        current = self.mode_steps.get(mode, -1)
        if current + 1 < next_step:
            self.mode_steps[mode] = next_step - 1
        elif current + 1 > next_step and mode not in self._warned_back:
            # A second fit()/train() with the same hook starts its count over: numbering it so
            # would save mode steps twice, and reads by mode step would find the first run's.
            self._warned_back.add(mode)
            logger.warning("smdebug: the trainer numbers its next %s step %d, but %s step %d is already saved (a "
                           "second training with the same callback?): its %s steps go on from %d instead, so "
                           "none is saved twice; give each training its own out_dir to keep the trainer's "
                           "numbers", mode.name, next_step, mode.name, current, mode.name, current + 1)

    def resume(self, seen: int, mode_steps: Dict[ModeKeys, int]) -> None:
        """Go on after global step ``seen`` of an earlier run of this job (spot training)."""
        self.global_step = seen
        self.mode_steps.update(mode_steps)
        self.mode_steps[ModeKeys.GLOBAL] = seen

    def counters(self, identity: Optional[Identity] = None) -> Tuple[int, Dict[ModeKeys, int]]:
        """``(global step, mode steps)`` to keep across restarts: as the training thread has them
        now, or as they were at the end of step ``identity`` (called on the pipeline's thread)."""
        if identity is None:
            return self.global_step, dict(self.mode_steps)
        step, mode, mode_step = identity
        try:
            mode_steps = dict(self.mode_steps)  # other modes' counters, as the training thread has them
        except RuntimeError:  # changed while copied: this mode's counter is the one that matters
            mode_steps = {}
        mode_steps[mode] = mode_step
        mode_steps[ModeKeys.GLOBAL] = step
        return step, mode_steps

"""When a PyTorch step begins and ends, whether it is whole, and who works at each point.

:class:`TorchStepDriver` owns step-boundary inference (the hook's module docstring, "What is
a step") and the one definition of the open step's kind: :attr:`~TorchStepDriver.saved_training_step`
(a saving TRAIN/GLOBAL step is open) and :attr:`~TorchStepDriver.complete` (the open step is
whole: written at close, or not at all). It calls the step's participants (participant.py)
in one fixed order at each point: module outputs, parameters with their fences, the
optimizer's updates and state, sharded parameters, routers, the flight recorder's locator,
the overhead budget's non-finite check (budget_capture.py; its callbacks are timed, :func:`charged`).

Where the points come from:

* ``begin``: the session's ``on_step_begin``, for a step begun by a registered model's
  forward pre-hook (:meth:`~TorchStepDriver.forward_pre`), by a step owner (a trainer
  callback, ``own_steps``) or by the user (``hook.begin_step()``);
* ``before_update``/``after_update``: the optimizer's pre- and post-step hooks, for an
  optimizer that updates a registered model; a step owner's ``capture_parameters``;
* ``end``: the session's ``on_step_end``; ``failed``: ``on_step_failed``; ``close``: ``on_close``.

A step is whole once its work is done: a TRAIN step counted by optimizer steps when its
``optimizer.step()`` returned, any other step the driver began when its registered model's
forward returned. Steps a step owner or the user began are theirs to judge (whole). A step
that is not whole when the hook closes (a ``KeyboardInterrupt`` or another exception cut it
short) is dropped, never written in part; every step ended before it is written.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from smdebug.capture.fail_open import never_raises
from smdebug.exceptions import TrainingStopRequested
from smdebug.logger import get_logger
from smdebug.modes import ModeKeys

from .budget_capture import BudgetParticipant, charged
from .models import RegisteredModels
from .module_capture import ModuleOutputs
from .nonfinite import NonfiniteLocator
from .optimizer_capture import OptimizerCapture
from .parameter_capture import Parameters
from .participant import TRAINING_MODES, StepParticipant
from .router import RouterCapture
from .sharded_capture import ShardedCapture

logger = get_logger("smdebug.pytorch")


class OptimizerParticipant(StepParticipant):
    """``update/<name>`` and ``optimizer/<name>/<key>`` around each optimizer step (optimizer_capture.py)."""

    def __init__(self, session, models: RegisteredModels):
        super().__init__(session)
        self.models = models
        self.capture = OptimizerCapture(session, session.backend)

    def before_update(self, optimizer, step) -> None:
        if optimizer is None:  # a step owner's capture_parameters: the optimizer's own hook comes next
            return
        if step.saved_training_step:
            self.capture.before_step(optimizer, self.models.names_by_id)
        else:
            self.capture.fence_state()

    def after_update(self, optimizer, step) -> None:
        if step.saved_training_step:
            self.capture.after_step(optimizer, self.models.names_by_id)

    def failed(self) -> None:
        self.capture.forget()

    def close(self) -> None:
        self.capture.forget()


class ShardedParticipant(StepParticipant):
    """Sharded parameters, reduced from their shards with one collective per saved step
    (sharded_capture.py): every rank takes part, saving or not."""

    def __init__(self, session):
        super().__init__(session)
        self.capture = ShardedCapture(session)

    def begin(self, step) -> None:
        if step.origin is step.FORWARD and self.capture.due():
            if not step.training:  # no gradients, no optimizer step: all of it now
                self.capture.capture(with_gradients=False)
            else:
                self.capture.start_weights()

    def before_update(self, optimizer, step) -> None:
        if step.training and self.capture.due():  # every rank joins its collectives
            self.capture.capture(with_gradients=True, before_update=True)

    def after_update(self, optimizer, step) -> None:
        if self.capture.unfinished:  # every rank, saving or not: the step's sharded updates and state
            self.capture.after_step(optimizer)

    def end(self, step) -> None:
        if self.capture.due():  # a TRAIN step with no optimizer step (manual updates)
            self.capture.capture(with_gradients=step.training, reread_weights=True)
        if self.capture.unfinished:
            self.capture.finish()

    def failed(self) -> None:
        self.capture.abandon()  # no collectives the other ranks may not reach


class RouterParticipant(StepParticipant):
    """Mixture-of-experts routing statistics of the step (router.py)."""

    def __init__(self, session, models: RegisteredModels):
        super().__init__(session)
        self.capture = RouterCapture(session, models.name_of, models.parent_of)

    def end(self, step) -> None:
        if self.capture:
            self.capture.hand_over()


class LocatorParticipant(StepParticipant):
    """The flight recorder's notes of where a NaN/Inf first appears in each step (nonfinite.py)."""

    def __init__(self, session):
        super().__init__(session)
        self.locator: Optional[NonfiniteLocator] = \
            NonfiniteLocator() if session.recorder is not None and session.flight_recorder.locate else None

    def end(self, step) -> None:
        locator = self.locator
        if locator is not None:
            self.session.set_step_probe(locator.take_probe())
            if not self.session.flight_recording and locator.installed:
                self.close()  # the recorder fired or was disabled: no more notes

    def close(self) -> None:
        if self.locator is not None:
            self.locator.remove()
            self.locator = None


class TorchStepDriver:
    """The PyTorch hook's step boundaries and its participants (module docstring)."""

    #: Who began the open step.
    FORWARD, OWNER, USER = "forward", "owner", "user"

    def __init__(self, session, models: RegisteredModels):
        self.session = session
        self.models = models
        self.modules = ModuleOutputs(session, models)
        self.sharded = ShardedParticipant(session)
        self.parameters = Parameters(session, models, self.sharded.capture)
        self.optimizer = OptimizerParticipant(session, models)
        self.routers = RouterParticipant(session, models)
        self.locator = LocatorParticipant(session)
        self.budget = BudgetParticipant(session, models)
        self.participants = (self.modules, self.parameters, self.optimizer, self.sharded, self.routers, self.locator,
                             self.budget)
        #: A TRAIN step is one optimizer step (an optimizer of the registered model is known).
        self.by_optimizer = False
        #: The integration (a trainer callback) that owns the step boundaries (own_steps).
        self.owner: Optional[str] = None
        #: The mode the user set (it overrides ``module.training``).
        self.user_mode: Optional[ModeKeys] = None
        self.origin = self.USER  # who began the open step
        self.updated = False  # the open step's optimizer update ran
        self.forwarded = False  # a registered model's forward returned in the open step
        self._next_origin: Optional[str] = None
        self._step = -1  # the global step the driver last began
        self._optimizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> (n groups, ours)

    @property
    def enabled(self) -> bool:  # for never_raises
        return self.session.enabled

    def disable(self, reason: str, already_reported: bool = False) -> None:
        self.session.disable(reason, already_reported)

    # --- what kind of step is open ---------------------------------------------------------------
    @property
    def saving(self) -> bool:
        return self.session.saving_step

    @property
    def training(self) -> bool:
        """The open (or last) step is a TRAIN or GLOBAL step."""
        return self.session.step_mode in TRAINING_MODES

    @property
    def saved_training_step(self) -> bool:
        """A saving TRAIN/GLOBAL step is open: the one definition of where weights,
        gradients, updates and optimizer state are captured."""
        session = self.session
        return session.saving_step and session.step_open and session.step_mode in TRAINING_MODES

    @property
    def armed(self) -> bool:
        """The open step was begun by a forward or a step owner: capture hooks and weights are armed."""
        return self.origin is not self.USER

    @property
    def complete(self) -> bool:
        """Whether the open step is whole (module docstring); True when no step is open."""
        session = self.session
        if not session.step_open or self.origin is not self.FORWARD:
            return True
        if self._step != session.global_step:  # a step began that the driver never saw begin
            return False
        if self.by_optimizer and self.training:
            return self.updated
        return self.forwarded

    def continues(self, mode: ModeKeys) -> bool:
        """A forward in ``mode`` belongs to the open step: the same optimizer step goes on
        (gradient accumulation, several forwards)."""
        session = self.session
        return self.by_optimizer and mode in TRAINING_MODES and session.step_open \
            and session.step_mode is mode and not self.updated

    # --- the session's callbacks --------------------------------------------------------------------
    def begin(self, saving: bool) -> None:
        origin = self._next_origin or (self.OWNER if self.owner is not None else self.USER)
        self._next_origin = None
        self.origin, self._step, self.forwarded = origin, self.session.global_step, False
        if origin is self.FORWARD:
            self.updated = False
        for participant in self.participants:
            participant.begin(self)

    def end(self) -> None:
        for participant in self.participants:
            participant.end(self)

    def failed(self) -> None:
        for participant in self.participants:
            participant.failed()

    def close(self) -> None:
        for participant in self.participants:
            participant.close()

    def drop_incomplete_step(self) -> None:
        """At close: a step that is not whole is not written (module docstring)."""
        session = self.session
        if session.enabled and not self.complete:
            logger.info("smdebug: step %d was cut short before its work was done (an interrupt or an error); "
                        "it is not written, the steps before it are", session.global_step)
            session.abandon_step()

    # --- the torch callbacks ------------------------------------------------------------------------
    def forward_pre(self, module: torch.nn.Module) -> None:
        """A registered model's forward begins: maybe a new step (module docstring of the hook)."""
        session = self.session
        if self.owner is not None:
            return  # steps, modes and stopping belong to the owner (own_steps)
        if session.stop_reason is not None:
            if session.step_open:
                session.end_step()
            raise TrainingStopRequested(f"smdebug stopped training: {session.stop_reason}")
        self._forward_pre(module)

    @never_raises("forward pre-hook")
    @charged
    def _forward_pre(self, module: torch.nn.Module) -> None:
        session = self.session
        mode = self.user_mode or (ModeKeys.TRAIN if module.training else ModeKeys.EVAL)
        if mode is not session.mode:
            session.set_mode(mode, by_user=False)  # module.training may change it back
        elif self.continues(mode):
            return
        self.parameters.fence_gradients(before_backward=True)
        self._next_origin = self.FORWARD
        try:
            session.begin_step()
        finally:
            self._next_origin = None

    @charged
    def forward_returned(self, root_name: str, args, output) -> None:
        """A registered model's forward returned: its tensors and its submodules' are handed
        over, and weights filed at the step's start fenced."""
        if self.session.saving_step:
            self.modules.on_module_forward(root_name, None, None, args, output, root=True)
            self._fence_filed_weights()
        self.forwarded = True

    @never_raises("module forward hook")
    def _fence_filed_weights(self) -> None:
        self.parameters.forward_returned()

    @never_raises("optimizer pre-step hook")
    @charged
    def optimizer_pre_step(self, optimizer, args, kwargs) -> None:
        if not self.owns(optimizer):
            return
        if self.owner is not None:  # the owner hands the parameters over itself (capture_parameters)
            self.optimizer.before_update(optimizer, self)
            return
        if not self.by_optimizer:
            self.by_optimizer = True
            logger.debug("smdebug: %s updates the registered model; a TRAIN step is now one optimizer step",
                         type(optimizer).__name__)
            self.sync_hooks()  # gradients are read here from now on
        for participant in self.participants:
            participant.before_update(optimizer, self)

    @never_raises("optimizer post-step hook")
    @charged
    def optimizer_post_step(self, optimizer, args, kwargs) -> None:
        # The step is over; it is closed (written) when the next one begins, as without an
        # optimizer, so that save_scalar() calls after optimizer.step() land in this step.
        if not self.owns(optimizer):
            return
        for participant in self.participants:
            participant.after_update(optimizer, self)
        if self.owner is None:
            self.updated = True

    @charged
    def capture_parameters(self, optimizer, wait_for_gradients: bool) -> None:
        """A step owner's update point (``Hook.capture_parameters``)."""
        if optimizer is not None and isinstance(optimizer, torch.optim.Optimizer):
            self.parameters.install_zero_grad_fence(optimizer)
        for participant in self.participants:
            participant.before_update(None, self)
        if wait_for_gradients:  # plain and sharded gradients read before the owner changes them
            self.parameters.fence_gradients()

    def own_steps(self, owner: str) -> None:
        self.owner = owner
        # Gradients come from capture_parameters(), never from per-parameter hooks.
        self.by_optimizer = True
        self.sync_hooks()

    def register_optimizer(self, optimizer) -> None:
        self._optimizers[optimizer] = (len(optimizer.param_groups), True)
        self.by_optimizer = True
        self.parameters.install_zero_grad_fence(optimizer)

    def owns(self, optimizer) -> bool:
        """Whether ``optimizer`` updates a parameter of a registered model (cached)."""
        groups = optimizer.param_groups
        known = self._optimizers.get(optimizer)
        if known is not None and known[0] == len(groups):
            return known[1]
        param_ids = self.models.param_ids
        ours = any(id(p) in param_ids for group in groups for p in group["params"])
        self._optimizers[optimizer] = (len(groups), ours)
        if ours:
            self.parameters.install_zero_grad_fence(optimizer)
        return ours

    def sync_hooks(self) -> None:
        """The capture hooks (submodules' forward hooks, gradient hooks) this step needs."""
        self.modules.sync_hooks()
        self.parameters.sync_hooks(self)

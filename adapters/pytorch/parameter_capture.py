"""Weights and gradients of the registered models, with their fences.

A participant of the PyTorch step driver (participant.py). The parameters are handed to the
step pipeline by reference, as one batch each for the weights and the gradients, and read
on its worker while training goes on; each batch has a fence, the point before which it must
have been read (docs/architecture.md, "Fences"):

* weights, in a step counted by optimizer steps: handed over at the step's first forward,
  fenced and filed just before ``optimizer.step()`` (handed over again if something else
  changed them meanwhile); otherwise filed at once and fenced when the forward ends;
* gradients: handed over just before ``optimizer.step()``; fenced by
  ``zero_grad(set_to_none=False)`` (wrapped while the hook lives) or by the next forward
  when a ``.grad`` handed over is still attached. Without a known optimizer they come from
  post-accumulate-grad hooks, one tensor at a time.
"""
from __future__ import annotations

import functools
import operator
import weakref
from typing import Optional, Tuple

from smdebug.capture.fail_open import never_raises

from .backend import _VERSION
from .models import RegisteredModels
from .module_capture import any_none, pick
from .participant import TRAINING_MODES, StepParticipant, remove_handles, weak_method

_GRAD = operator.attrgetter("grad")


class Parameters(StepParticipant):
    """The registered models' plain (unsharded) weights and gradients (module docstring)."""

    def __init__(self, session, models: RegisteredModels, sharded):
        super().__init__(session)
        self.models = models
        self._sharded = sharded  # its gradients' partials are fenced with ours
        self._handles: list = []  # post-accumulate-grad hooks, while steps save without a known optimizer
        self._key: Optional[tuple] = None  # what the installed hooks were chosen for
        self._captured = False  # this step's weights were handed over
        # Batches handed to the step pipeline whose tensors may not change until waited for:
        # the weights of the open step (fenced before optimizer.step()), and the last saved
        # gradients with their parameters (fenced before anything can write into them).
        self._weights_batch: Optional[tuple] = None  # (batch, tensors, their versions, filed)
        self._grads_batch = None
        self._grads_held: Tuple[list, list] = ([], [])
        self._zero_grad_fences: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    # --- the step points ---------------------------------------------------------------------
    def begin(self, step) -> None:
        self._captured = False
        if not step.armed:
            return
        if step.saving or self._handles:
            self.sync_hooks(step)
        if step.saving:
            # Weights are read on the pipeline's worker during this forward and backward; in a
            # step counted by optimizer steps they are filed (and fenced) before the update.
            self.start_weights(file_now=not (step.by_optimizer and step.training))

    def before_update(self, optimizer, step) -> None:
        """Fence and file the weights; in a saved training step, hand the gradients over."""
        if step.saved_training_step and not step.updated:
            self.capture(with_gradients=True)
        elif step.owner is None:  # a step owner's call that saves nothing leaves the weights be
            self.fence_weights()

    def end(self, step) -> None:
        if step.owner is not None and self._weights_batch is not None:
            # An owned step that ended without capture_parameters() (no optimizer update): keep its weights.
            self._fence_weights_guarded()

    def failed(self) -> None:
        """The failed step keeps the weights its forward used, for the flight recorder."""
        if self.session.flight_recording and self.session.step_open:
            self._fence_weights_guarded()

    def close(self) -> None:
        remove_handles(self._handles)
        self._key = None
        for owner, fence in list(self._zero_grad_fences.items()):
            if owner.__dict__.get("zero_grad") is fence:
                del owner.zero_grad  # the class's own zero_grad again
        self._zero_grad_fences = weakref.WeakKeyDictionary()
        # the run is over: let go of the last step's tensors
        self._weights_batch, self._grads_batch, self._grads_held = None, None, ([], [])

    def forward_returned(self) -> None:
        """A registered model's forward ended: weights filed at the step's start are fenced
        here (no optimizer step to wait for: whatever updates them comes next)."""
        if self._weights_batch is not None and self._weights_batch[3]:
            self.fence_weights()

    @never_raises("filing the step's weights")
    def _fence_weights_guarded(self) -> None:
        self.fence_weights()

    # --- weights -----------------------------------------------------------------------------
    def start_weights(self, file_now: bool) -> None:
        """Hand this step's wanted parameters to the step pipeline (by reference).

        ``file_now``: file them into the step at once and fence them at the end of the
        forward pass (no known optimizer: whatever updates them comes after the forward).
        Otherwise they are fenced and filed before ``optimizer.step()``.
        """
        if self._captured:
            return
        self._captured = True
        session = self.session
        selection = session.plans.selection(self.models.param_names)
        tensors = pick(self.models.param_tensors, selection.indices)
        batch = session.inbox.start_batch(selection, tensors, session.backend)
        if batch is None:
            return
        self._weights_batch = (batch, tensors, list(map(_VERSION, tensors)), file_now)
        if file_now:
            session.inbox.record_batch(batch)

    def fence_weights(self) -> None:
        """The weights handed over at the step's start are read; file them if not yet filed.

        Weights changed in place since then (by something other than the optimizer, which
        comes after this fence) are handed over again now, so the step keeps the values
        they have just before ``optimizer.step()``.
        """
        if self._weights_batch is None:
            return
        (batch, tensors, versions, filed), self._weights_batch = self._weights_batch, None
        batch.wait()
        if filed:
            return
        session = self.session
        if list(map(_VERSION, tensors)) != versions:
            batch = session.inbox.start_batch(batch.selection, tensors, session.backend)
            batch.wait()
        session.inbox.record_batch(batch)

    # --- gradients ---------------------------------------------------------------------------
    def capture(self, with_gradients: bool) -> None:
        """Before ``optimizer.step()``: fence and file the weights, hand over the gradients."""
        if not self._captured:
            self.start_weights(file_now=False)
        self.fence_weights()  # the optimizer changes them next
        if not with_gradients:
            return
        # C-level passes over the parameters (their Python loops cost the training thread
        # more than their work: docs/performance.md, "cold" code).
        session, models = self.session, self.models
        params = models.param_tensors
        all_grads = list(map(_GRAD, params))
        if not any_none(all_grads):
            names, held, grads = models.grad_names, params, all_grads
        else:
            having = [i for i, grad in enumerate(all_grads) if grad is not None]
            names = tuple(pick(models.grad_names, having))
            held, grads = pick(params, having), pick(all_grads, having)
        selection = session.plans.selection(names)
        if not selection.plans:
            return
        held, grads = pick(held, selection.indices), pick(grads, selection.indices)
        session.discard(self._grads_held)  # last step's gradients, freed off this thread
        self._grads_batch = session.inbox.start_batch(selection, grads, session.backend)
        self._grads_held = (held, grads)
        session.inbox.record_batch(self._grads_batch)

    def fence_gradients(self, before_backward: bool = False) -> None:
        """Wait until the last handed-over gradients were read, if they can change now.

        ``before_backward``: the next backward writes into a ``.grad`` that is still the
        tensor handed over (its gradients were not set to None), so wait; gradients set to
        None by ``zero_grad()`` are never written again and the worker may go on reading them
        while training goes on.
        """
        self._sharded.fence_gradients()  # sharded gradients' partials are read on the worker
        batch = self._grads_batch
        if batch is None:
            return
        if before_backward:
            held, grads = self._grads_held
            if not any(map(operator.is_, map(_GRAD, held), grads)):
                return
        self.session.discard(self._grads_held)
        self._grads_batch, self._grads_held = None, ([], [])
        batch.wait()

    def install_zero_grad_fence(self, owner) -> None:
        """Make ``owner.zero_grad(set_to_none=False)`` (an optimizer's or a registered model's)
        wait for the handed-over gradients first: it zeroes them in place. The default,
        ``set_to_none=True``, only drops them and needs no wait. Undone at close."""
        if owner in self._zero_grad_fences or not callable(getattr(owner, "zero_grad", None)):
            return
        original = owner.zero_grad
        ref = weakref.ref(self)

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            me = ref()
            set_to_none = kwargs.get("set_to_none", args[0] if args else True)
            if me is not None and not set_to_none:
                me.fence_gradients()
            return original(*args, **kwargs)

        owner.zero_grad = zero_grad
        self._zero_grad_fences[owner] = zero_grad

    def sync_hooks(self, step) -> None:
        """Without a known optimizer, TRAIN steps read gradients from post-accumulate-grad hooks
        (``.grad`` once autograd finished with it; the last backward of the step wins)."""
        session = self.session
        if not (session.saving_step and session.enabled):
            if self._handles:
                remove_handles(self._handles)
                self._key = None
            return
        by_hooks = session.mode in TRAINING_MODES and not step.by_optimizer
        key = (session.plans.version, by_hooks, len(self.models.params))
        if key == self._key:
            return
        remove_handles(self._handles)
        self._key = key
        if by_hooks:
            for name, param in self.models.params:
                if param.requires_grad and session.plans.plan_for(f"gradient/{name}") is not None:
                    self._handles.append(param.register_post_accumulate_grad_hook(
                        functools.partial(weak_method(self._on_grad_accumulated), f"gradient/{name}")))

    def _on_grad_accumulated(self, name: str, param) -> None:
        session = self.session
        if session.saving_step and session.enabled and param.grad is not None:
            session.inbox.record(name, param.grad, session.backend)

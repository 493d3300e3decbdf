"""The one internal protocol of the PyTorch adapter's work at step points.

The step driver (step_driver.py) owns when a step begins and ends and whether it is
complete; everything else the hook does at those points is a :class:`StepParticipant`,
called by the driver in a fixed order (module outputs, parameters with their fences, the
optimizer's updates and state, sharded parameters, routers, the flight recorder's locator):

* ``begin(step)``: a step has begun (``step`` is the driver: what kind of step, whether it saves);
* ``before_update(optimizer, step)``: just before the registered model's weights are updated
  (the optimizer's pre-step hook, or a step owner's ``capture_parameters``);
* ``after_update(optimizer, step)``: the optimizer's post-step hook;
* ``end(step)``: the step is about to end: hand over what is still held;
* ``failed()``: an exception left the training step on this worker;
* ``close()``: the run is over, or capture was disabled: let go of torch hooks and tensors.

Each is a no-op here; a participant overrides the points it works at. A participant is
guarded like the hook (``never_raises``: ``enabled``/``disable`` are its session's).
"""
from __future__ import annotations

import weakref

import torch

from smdebug.modes import ModeKeys

TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)
compiler_disable = getattr(getattr(torch, "compiler", None), "disable", lambda fn: fn)
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def weak_method(method):
    """A torch callback that calls ``method`` while its object lives (the hook can be collected).

    torch.compile does not trace it: it runs eagerly, with a graph break, in a compiled region.
    """
    ref = weakref.WeakMethod(method)

    @compiler_disable
    def call(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call


def eager_forward_hook(capture):
    """A forward hook running ``capture(module, args, output)``: eagerly, behind a graph break,
    while torch.compile traces it (a model compiled after it was registered); otherwise
    directly (the compiler.disable wrapper costs more than a capture)."""
    captured_eagerly = compiler_disable(capture)

    def on_forward(module, args, output):
        if is_compiling():
            return captured_eagerly(module, args, output)
        return capture(module, args, output)

    return on_forward


def remove_handles(handles: list) -> None:
    while handles:
        handles.pop().remove()


class StepParticipant:
    """Work of the adapter at the step points (module docstring); no-ops by default."""

    def __init__(self, session):
        self.session = session

    @property
    def enabled(self) -> bool:  # for never_raises: the session's fail-open policy
        return self.session.enabled

    def disable(self, reason: str, already_reported: bool = False) -> None:
        self.session.disable(reason, already_reported)

    def begin(self, step) -> None:
        """A step has begun; ``step`` is the driver (``saving``, ``origin``, ``training``...)."""

    def before_update(self, optimizer, step) -> None:
        """The registered model's weights are updated next (``optimizer``: None for a step owner's)."""

    def after_update(self, optimizer, step) -> None:
        """``optimizer`` has updated the weights."""

    def end(self, step) -> None:
        """The open step ends: hand over what is still held."""

    def failed(self) -> None:
        """An exception left the training step: start nothing the other workers may not reach."""

    def close(self) -> None:
        """The run is over (or capture disabled): remove torch hooks, let go of tensors."""

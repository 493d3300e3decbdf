"""What an optimizer step does to the weights: the ``updates`` and ``optimizer_variables`` collections.

* ``update/<weight name>``: the step's update, the value just after ``optimizer.step()``
  minus the value just before. The wanted parameters are copied negated in the optimizer's
  pre-step hook and the copy becomes the update in its post-step hook (``-before + after``,
  in place, one fused ``_foreach`` call): exact at any save interval, since it never depends on what
  was saved at another step. Half-precision parameters are copied in float32, so the
  difference keeps the bits a bfloat16 subtraction would round away.
* ``optimizer/<weight name>/<state key>``: every tensor in ``optimizer.state[param]`` after
  the step (``exp_avg``, ``exp_avg_sq``, ``step`` for Adam/AdamW, ``momentum_buffer`` for
  SGD, whatever a fused or foreach implementation keeps: the state dict is the same).

Each is captured only at steps that save its own collection (``updates``,
``optimizer_variables``, which exists only once asked for by name; ``save_all`` and ``all``
include every collection, as in 1.0.34): a
collection of another name whose regex matches ``update/...`` does not start the capture. The
updates cost a transient copy of the wanted parameters per saved step.
Both go through the step pipeline as any batch (reductions on the tensors' device, one
transfer per saved step), only on saving steps of TRAIN mode; steps that save neither cost
one plan lookup. The optimizer's state changes in place at the next ``optimizer.step()``:
the batch is fenced (read) before it. A failure here warns once and turns off that part
only (updates, or optimizer state); the rest of the capture goes on.

Sharded parameters (FSDP2, DTensor, FSDP v1) are left to :mod:`smdebug.pytorch.sharded_capture`,
which reduces their updates and state from each rank's pieces with :func:`copy_before` and
:func:`updates_in_place`.
"""
from __future__ import annotations

import operator
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from smdebug.collections import OPTIMIZER_STATE_PREFIX, UPDATE_PREFIX, CollectionKeys
from smdebug.logger import get_logger

logger = get_logger("smdebug.pytorch")

_HALF = (torch.float16, torch.bfloat16)
_DETACH = operator.methodcaller("detach")


def copy_before(param: torch.Tensor) -> torch.Tensor:
    """A parameter's value before the step, negated (half precision: in float32): made in the
    copy's one pass, it becomes the update with one add (:func:`updates_in_place`)."""
    value = param.detach()
    return value.to(torch.float32).neg_() if value.dtype in _HALF else torch.neg(value)


def updates_in_place(copies: List[torch.Tensor], after: List[torch.Tensor]) -> None:
    """``copies`` (:func:`copy_before`) become the updates ``after - before``: one fused call,
    ``-before + after`` (+0 where nothing changed)."""
    torch._foreach_add_(copies, after)


class OptimizerCapture:
    """Updates and optimizer state of a hook's named parameters (module docstring)."""

    UPDATES = "updates"
    STATE = "optimizer state"

    def __init__(self, session, backend):
        self.session = session
        self._backend = backend
        #: optimizer -> (selection, parameters, their copies) between its pre- and post-step
        self._pending: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        #: optimizer -> ((groups, parameters known), [(name, param)] it updates, update names)
        self._named: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._state_batch = None
        self.disabled: set = set()

    def _fail(self, part: str, exc: Exception) -> None:
        self.disabled.add(part)
        self._pending = weakref.WeakKeyDictionary()
        logger.warning("smdebug: saving the %s failed (%s: %s); it is off for the rest of the run, "
                       "the rest of the capture goes on", part, type(exc).__name__, exc)

    def _named_params(self, optimizer, names_by_id: Dict[int, str]) -> Tuple[List[Tuple[str, torch.Tensor]], tuple]:
        """The registered parameters ``optimizer`` updates, named, and their update names (cached)."""
        groups = optimizer.param_groups
        key = (len(groups), sum(len(g["params"]) for g in groups), len(names_by_id))
        known = self._named.get(optimizer)
        if known is not None and known[0] == key:
            return known[1], known[2]
        named = [(names_by_id[id(p)], p) for g in groups for p in g["params"] if id(p) in names_by_id]
        update_names = tuple(UPDATE_PREFIX + name for name, _ in named)
        self._named[optimizer] = (key, named, update_names)
        return named, update_names

    def before_step(self, optimizer, names_by_id: Dict[int, str]) -> None:
        """The optimizer's pre-step hook, in a saving TRAIN step: copy the wanted parameters."""
        self.fence_state()
        if self.UPDATES in self.disabled or CollectionKeys.UPDATES not in self.session.plans.saving_collections:
            return
        try:
            named, update_names = self._named_params(optimizer, names_by_id)
            selection = self.session.plans.selection(update_names)
            if not selection.plans:
                return
            params = [named[i][1] for i in selection.indices]
            with torch.no_grad():
                self._pending[optimizer] = (selection, params, list(map(copy_before, params)))
        except Exception as exc:  # noqa: BLE001 - updates off, training and the rest of the capture go on
            self._fail(self.UPDATES, exc)

    def after_step(self, optimizer, names_by_id: Dict[int, str]) -> None:
        """The optimizer's post-step hook, in a saving TRAIN step: hand over the updates and
        the optimizer's state."""
        pending = self._pending.pop(optimizer, None)
        inbox = self.session.inbox
        if pending is not None and self.UPDATES not in self.disabled:
            try:
                selection, params, updates = pending
                with torch.no_grad():
                    updates_in_place(updates, list(map(_DETACH, params)))
                inbox.record_batch(inbox.start_batch(selection, updates, self._backend))
            except Exception as exc:  # noqa: BLE001 - updates off, training and the rest of the capture go on
                self._fail(self.UPDATES, exc)
        if self.STATE not in self.disabled and \
                CollectionKeys.OPTIMIZER_VARIABLES in self.session.plans.saving_collections:
            try:
                self._hand_over_state(optimizer, names_by_id)
            except Exception as exc:  # noqa: BLE001 - optimizer state off, the rest goes on
                self._fail(self.STATE, exc)

    def _hand_over_state(self, optimizer, names_by_id: Dict[int, str]) -> None:
        named, _ = self._named_params(optimizer, names_by_id)
        state = optimizer.state
        names, tensors = [], []
        for name, param in named:
            for key, value in state.get(param, {}).items():
                if isinstance(value, torch.Tensor):
                    names.append(f"{OPTIMIZER_STATE_PREFIX}{name}/{key}")
                    tensors.append(value)
        if not names:
            return
        selection = self.session.plans.selection(tuple(names))
        if not selection.plans:
            return
        inbox = self.session.inbox
        batch = inbox.start_batch(selection, [tensors[i] for i in selection.indices], self._backend)
        inbox.record_batch(batch)
        self._state_batch = batch

    def fence_state(self) -> None:
        """Before anything changes the optimizer's state in place (its next step): the handed
        over state is read."""
        batch, self._state_batch = self._state_batch, None
        if batch is not None:
            batch.wait()

    def forget(self, optimizer: Optional[object] = None) -> None:
        """Drop copies made for a step that will not finish (a failed step, close)."""
        if optimizer is None:
            self._pending = weakref.WeakKeyDictionary()
        else:
            self._pending.pop(optimizer, None)

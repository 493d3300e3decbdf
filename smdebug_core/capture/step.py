"""What a saved step carries from the adapter to the writer.

* :class:`TensorPlan`: what to save of one tensor name at this step (from its collections);
* :class:`Selection`: the plans of a fixed list of names, grouped for batched hand-over;
* :class:`TensorBatch`: tensors handed over together (the hot path; finished by the
  backend on the step pipeline or at hand-over), with its fence (``wait``);
* :class:`ReducedBlock`: reductions an adapter computed itself (TensorFlow's graph);
* :class:`StepValues`: a finished step's host values, for step listeners (live rules).

The :class:`~smdebug.capture.session.StepSession` makes and files them; adapters only hold them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .backend import BatchResult
from ..modes import ModeKeys
from .pipeline import Ticket


@dataclass(frozen=True)
class TensorPlan:
    """What to save of one tensor name at the current step (derived from its collections)."""

    name: str
    raw: bool
    shape: bool
    reductions: Tuple[Tuple[str, bool], ...]
    histogram_tag: Optional[str]
    tb_scalar: bool
    sm_metric: bool
    #: The value must be kept until the end of the step (copied if it may change before).
    needs_value: bool = False
    #: The whole value is needed on the host (saved raw, or a TensorBoard scalar/histogram).
    needs_host: bool = False
    #: The record name of each of ``reductions``, in the same order (made once per plan).
    reduction_tags: Tuple[str, ...] = ()


class ReducedBlock:
    """Tensors whose reductions an adapter computes itself, laid out once by
    :meth:`StepInbox.reduced_block` so that :meth:`StepInbox.record_reduced` files a step of them
    without per-tensor Python (a step may hold hundreds of such tensors).

    ``entries`` are ``(plan, shape)``; the values of a step are every reduction of every
    entry, entry after entry, each in its plan's order: ``len(block.tags)`` of them.
    """

    __slots__ = ("entries", "names", "tags", "shapes")

    def __init__(self, entries: Sequence[Tuple[TensorPlan, Optional[tuple]]]):
        self.entries = tuple((plan, None if shape is None else tuple(shape)) for plan, shape in entries)
        self.names = frozenset(plan.name for plan, _ in self.entries)
        if len(self.names) != len(self.entries):
            raise ValueError("a ReducedBlock names each tensor once")
        #: the record name of every value, in order
        self.tags = tuple(tag for plan, _ in self.entries for tag in plan.reduction_tags)
        #: the shape records the plans ask for
        self.shapes = tuple((plan.name, shape) for plan, shape in self.entries if plan.shape and shape is not None)

    def split(self, values) -> List[Tuple[TensorPlan, Optional[tuple], Sequence]]:
        """``(plan, shape, its values)`` per entry."""
        out, start = [], 0
        for plan, shape in self.entries:
            stop = start + len(plan.reduction_tags)
            out.append((plan, shape, values[start:stop]))
            start = stop
        return out


class Selection:
    """The tensors of a fixed list of names that this step saves, prepared once for batches.

    Made by :meth:`StepPlans.selection` and cached while the plans stay the same: ``indices``
    into the names, their ``plans``, and how they split into groups of one signature (same
    reductions, raw or not, shape or not), each finished by one backend call.
    """

    __slots__ = ("indices", "plans", "names", "groups", "fast_tags")

    def __init__(self, indices: Sequence[int], plans: Sequence[TensorPlan]):
        self.indices = tuple(indices)
        self.plans = tuple(plans)
        #: the tensor names, for the end of step's check that no name was recorded twice
        self.names = frozenset(plan.name for plan in self.plans)
        by_signature: Dict[tuple, List[int]] = {}
        for pos, plan in enumerate(self.plans):
            by_signature.setdefault((plan.reductions, plan.needs_host, plan.shape), []).append(pos)
        #: ``(positions, reduction keys, raw wanted, shape wanted)`` per signature
        self.groups = tuple((tuple(positions), keys, raw, shape)
                            for (keys, raw, shape), positions in by_signature.items())
        #: The records of a step of this selection, when they can be written without per-tensor
        #: Python: one group, reductions only, no TensorBoard or SageMaker side outputs.
        simple = len(self.groups) == 1 and all(
            not (p.raw or p.histogram_tag or p.tb_scalar or p.sm_metric or p.needs_host) for p in self.plans)
        self.fast_tags = tuple(tag for p in self.plans for tag in p.reduction_tags) if simple else None


class TensorBatch:
    """Tensors handed over together (:meth:`StepInbox.start_batch`): one carrier for a batch of
    tensors from reference to records. Its backend work runs on the step pipeline; ``wait``
    is the adapter's fence before the tensors may change."""

    __slots__ = ("selection", "tickets")

    def __init__(self, selection: Selection, tickets: List[Ticket]):
        self.selection = selection
        self.tickets = tickets

    def wait(self, timeout: Optional[float] = None) -> None:
        """Return once the batch's tensors were read (they may change from now on)."""
        for ticket in self.tickets:
            ticket.wait(timeout)

    def results(self) -> Optional[List[BatchResult]]:
        """One result per group of the selection; None if the backend failed on the batch."""
        out = [ticket.wait() for ticket in self.tickets]
        return None if any(r is None for r in out) else out


@dataclass
class StepValues:
    """What one saved step produced, as host arrays: given to step listeners (live rules)."""

    global_step: int
    mode: ModeKeys
    mode_step: int
    worker: str
    tensors: Dict[str, np.ndarray]
    reductions: Dict[str, Dict[Tuple[str, bool], np.ndarray]]

"""What an adapter hands over during a step, kept until the step ends: the step's inbox.

Adapters reach it as ``session.inbox`` (:class:`~smdebug.capture.contract.InboxSurface`):
batches of tensors (the hot path: references only, reduced on the step pipeline's worker),
tensors one by one, reductions the adapter computed itself, and where a saved piece lies
in a sharded tensor. Everything waits as one kind of entry, :class:`PendingEntry`, in
recording order; the step's end takes them all (:meth:`StepInbox.take`) and
:mod:`.step_records` makes the step's records from them.

Thread-safe: adapters may hand over from the framework's threads (backward hooks).
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..logger import get_logger
from .backend import TensorBackend
from .fail_open import never_raises
from .pipeline import StepPipeline
from .plans import StepPlans
from .step import ReducedBlock, Selection, TensorBatch, TensorPlan

logger = get_logger()


class Kind(enum.Enum):
    TENSOR = "a tensor to materialize"  # payload: the backend's snapshot
    DONE = "a tensor already materialized"  # payload: a backend.Materialized
    BATCH = "a batch of tensors"  # payload: a TensorBatch
    BLOCK = "reductions the adapter computed"  # payload: (ReducedBlock, values)


@dataclass(frozen=True)
class PendingEntry:
    """One thing handed over in a step. ``plan`` and ``backend`` are those of a single tensor
    (TENSOR, DONE); a batch or a block carries its plans itself."""

    kind: Kind
    payload: Any
    plan: Optional[TensorPlan] = None
    backend: Optional[TensorBackend] = None

    @property
    def names(self) -> Tuple[str, ...]:
        """The tensor names this entry records."""
        if self.kind is Kind.BATCH:
            return self.payload.selection.names
        if self.kind is Kind.BLOCK:
            return self.payload[0].names
        assert self.plan is not None  # a single tensor's entry has its plan
        return (self.plan.name,)


class TakenStep(NamedTuple):
    """A step's inbox at its end."""

    entries: Dict[object, PendingEntry]  # recording order; a name recorded again moved to the end
    grouped: bool  # whether a batch or block is among them (names may then be recorded twice)
    scalars: List[Tuple[str, object, bool, Optional[float]]]  # (name, value, sm_metric, timestamp)
    placements: Dict[str, dict]  # name -> where its saved piece lies in a sharded tensor


class StepInbox:
    """The open step's hand-over (module docstring). Built by the session, which gives it
    what it decides with: ``plans`` (what the step saves), the step pipeline, the tensors
    the backend could not handle (``skipped``/``skip_tensor``), and the fail-open policy
    (``is_enabled``/``disable``)."""

    def __init__(self, plans: StepPlans, pipeline: StepPipeline, backend: TensorBackend, numpy_backend: TensorBackend,
                 skipped: set, skip_tensor: Callable[[str, Exception], None],
                 is_enabled: Callable[[], bool], disable: Callable[..., None]):
        self.plans, self._pipeline = plans, pipeline
        self._backend, self._numpy_backend = backend, numpy_backend
        self._skipped, self._skip_tensor = skipped, skip_tensor
        self._is_enabled, self.disable = is_enabled, disable
        self._lock = threading.RLock()
        self._entries: Dict[object, PendingEntry] = {}
        self._grouped = False
        self._scalars: List[Tuple[str, object, bool, Optional[float]]] = []
        self._placements: Dict[str, dict] = {}

    @property
    def enabled(self) -> bool:  # for never_raises
        return self._is_enabled()

    def __bool__(self) -> bool:
        return bool(self._entries or self._scalars)

    def backend_for(self, value) -> TensorBackend:
        return self._backend if self._backend.accepts(value) else self._numpy_backend

    # --- batches: the hot path -----------------------------------------------------------
    @never_raises("handing over tensors")
    def start_batch(self, selection: Selection, tensors: Sequence, backend: TensorBackend) -> Optional[TensorBatch]:
        """Hand over ``tensors`` (one per ``selection.plans``, in order) without waiting:
        ``backend.start_batch`` runs now, ``backend.finish_batch`` on the step pipeline's
        worker. The tensors must not change until ``batch.wait()`` returns (the adapter's
        fence). File the batch into the step with :meth:`record_batch` (where it is filed
        decides its records' place in the step's files). None when nothing is saved.
        """
        if not (self.plans.saving and self.enabled and selection.plans):
            return None
        tickets = []
        for positions, keys, raw, _ in selection.groups:
            members = tensors if len(selection.groups) == 1 else [tensors[p] for p in positions]
            started = backend.start_batch(members, keys, raw)
            run = self._pipeline.run_here if backend.finish_here(started) else self._pipeline.submit
            tickets.append(run("reducing tensors", backend.finish_batch, started))
        return TensorBatch(selection, tickets)

    def record_batch(self, batch: Optional[TensorBatch]) -> None:
        """File a :class:`TensorBatch` into the current step (the last record of a name wins)."""
        if batch is None or not self.plans.saving:
            return
        with self._lock:
            self._entries[batch] = PendingEntry(Kind.BATCH, batch)
            self._grouped = True

    # --- tensors one by one ------------------------------------------------------------
    @never_raises("record")
    def record(self, name: str, value, backend: Optional[TensorBackend] = None) -> bool:
        """Offer a tensor for the current step; returns whether it will be saved."""
        if not self.plans.saving:
            return False
        return self.hold(((name, value),), backend or self.backend_for(value)) == 1

    @never_raises("record")
    def record_planned(self, plan: TensorPlan, value, backend: TensorBackend) -> bool:
        """Offer a tensor under ``plan``: this step's plan of its name, narrowed by the adapter
        (``dataclasses.replace``) to what it can save faithfully (a shard of a sharded tensor:
        the reductions exact from its shards' partials, which its snapshot carries)."""
        if not self.plans.saving:
            return False
        return self.hold(((plan.name, value),), backend, plan) == 1

    @never_raises("record")
    def record_many(self, items, backend: Optional[TensorBackend] = None) -> int:
        """Offer several ``(name, value)`` of one backend (None: host values, numpy) at once;
        returns how many will be saved.

        The same as :meth:`record` for each, with one lock for all: adapters use it for
        tensors they gathered (parameters before an optimizer step, a forward's outputs).
        """
        if not self.plans.saving:
            return 0
        return self.hold(items, backend or self._numpy_backend)

    def hold(self, items, backend: TensorBackend, given: Optional[TensorPlan] = None) -> int:
        """Snapshot the wanted ``(name, value)`` items and keep them for the end of the step."""
        held = []
        for name, value in items:
            plan = given or self.plans.plan_for(name)
            if plan is not None and name not in self._skipped:
                try:
                    held.append((name, plan, backend.snapshot(value, plan.needs_value)))
                except Exception as exc:  # noqa: BLE001 - one bad tensor costs that tensor only
                    self._skip_tensor(name, exc)
        with self._lock:
            entries = self._entries
            for name, plan, snap in held:
                if entries.pop(name, None) is not None:
                    logger.debug("tensor %s recorded twice in a step; keeping the last value", name)
                entries[name] = PendingEntry(Kind.TENSOR, snap, plan, backend)
        return len(held)

    # --- reductions the adapter computed itself ----------------------------------------------
    def reduced_block(self, entries: Sequence[Tuple[TensorPlan, Optional[tuple]]]) -> ReducedBlock:
        """Lay out tensors whose reductions the adapter computes itself, for
        :meth:`record_reduced`: ``entries`` are ``(plan, shape)``, ``plan`` this step's plan of
        the tensor (from ``plans.select`` or ``plans.plan_for``) asking for reductions only,
        ``shape`` the tensor's shape (for a shape record) or None. Build it once and keep it
        while ``plans.select`` returns the same plans."""
        return ReducedBlock(entries)

    @never_raises("record")
    def record_reduced(self, block: ReducedBlock, values: Sequence) -> int:
        """Offer this step's reductions of the tensors of ``block`` (:meth:`reduced_block`):
        every reduction of every tensor, tensor after tensor, each in its plan's order, as
        numpy float64 scalars (written as they are). Returns how many tensors were taken.
        Skips the per-tensor backend round trip and per-tensor Python: an adapter that
        reduces in its own graph hands a step over at the cost of one call.
        """
        if not self.plans.saving:
            return 0
        if len(values) != len(block.tags):
            raise ValueError(f"record_reduced: {len(values)} values for a block of {len(block.tags)} reductions")
        with self._lock:
            self._entries.pop(block, None)
            self._entries[block] = PendingEntry(Kind.BLOCK, (block, values))
            self._grouped = True
        return len(block.entries)

    def note_placement(self, name: str, placement: dict) -> None:
        """Say that the value recorded as ``name`` in this step is one piece of a larger tensor
        (a shard of a sharded parameter): ``placement`` (``global_shape``, ``local_shape`` and
        ``offsets`` of the block, or ``flat_offset`` in the flattened tensor) is written into the
        step's index file (docs/format.md 3.3), where our Trial finds it to reassemble the full
        tensor from every worker's piece and readers of the original format do not look."""
        if self.plans.saving:
            with self._lock:
                self._placements[name] = placement

    def add_scalar(self, name: str, value, sm_metric: bool, timestamp: Optional[float]) -> None:
        with self._lock:
            self._scalars.append((name, value, sm_metric, timestamp))

    def take(self) -> TakenStep:
        """Everything handed over since the last take, emptying the inbox."""
        with self._lock:
            taken = TakenStep(self._entries, self._grouped, self._scalars, self._placements)
            self._entries, self._grouped, self._scalars, self._placements = {}, False, [], {}
        return taken

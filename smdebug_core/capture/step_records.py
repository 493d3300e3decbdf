"""A finished step's records: what the step session hands its step sinks at the end of each
saved step, made on the step pipeline's worker (or inline when that is cheaper).

:class:`StepRecordMaker` turns the step's pending entries (handed-over batches, single
tensors, reduced blocks) and scalars into a :class:`FinishedStep`: records in recording
order (raw values, reduction records, TensorBoard scalars and histograms, SageMaker metric
lines), names saved twice resolved, and, when asked, the names of non-finite tensors and the
values live rules see. It knows no consumer: the session gives the result to its sinks
(:mod:`.sinks`). Everything it reads of the step comes in its arguments, never from the
training thread's current state.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .backend import BatchResult, Materialized, Request, TensorBackend
from .flight_recorder import nonfinite_rows, reductions_nonfinite, value_is_nonfinite
from .inbox import Kind, PendingEntry
from ..logger import get_logger
from ..modes import ModeKeys
from ..reduction_config import reduction_tag
from .step import ReducedBlock, Selection, StepValues, TensorBatch, TensorPlan
from ..storage.step_data import ScalarRun

logger = get_logger()


@dataclass(frozen=True)
class FinishedStep:
    """One saved step's records, as its sinks receive them (in this order of the lists).
    Read-only: a sink that changes what the sinks after it get returns a new step
    (``dataclasses.replace``), never changes the one it was given (:mod:`.sinks`)."""

    identity: Tuple[int, ModeKeys, int]  # (global step, mode, mode step)
    worker: str
    tensors: list = field(default_factory=list)  # (tag, array) records and ScalarRuns
    shapes: list = field(default_factory=list)  # (name, shape)
    tb_scalars: list = field(default_factory=list)
    tb_histograms: list = field(default_factory=list)
    metrics: list = field(default_factory=list)  # SageMaker metric lines: (name, value, timestamp)
    timed: list = field(default_factory=list)  # scalars given a timestamp: (wall_time, tag, array)
    placements: Dict[str, dict] = field(default_factory=dict)  # name -> its piece of a sharded tensor
    collections: Optional[bytes] = None  # the collections file, with the run's first saved step
    #: Kept for the flight recorder only (the save config skips it): its sink writes the scalars alone.
    ring_only: bool = False
    probe: object = None  # the adapter's non-finite probe of the step (flight recorder)
    #: Names of non-finite tensors (None: not checked, the flight recorder is off).
    nonfinite: Optional[List[str]] = None
    values: Optional[StepValues] = None  # what live rules see (None: nobody listens)
    #: Where the scalars' records start in (tensors, tb_scalars, metrics).
    scalars_from: Tuple[int, int, int] = (0, 0, 0)
    written: bool = False  # a writer took the step (set by the writer's sink)


class StepRecordMaker:
    """Makes :class:`FinishedStep` records; remembers only which tensors the backend could not
    handle (skipped from then on) and which lost tensors were warned of."""

    def __init__(self, strip_output_index: bool, backend_for: Callable[[object], TensorBackend]):
        self.strip = strip_output_index
        self._backend_for = backend_for
        self._warned_lost: set = set()
        self.skipped: set = set()  # tensors the backend could not handle: never recorded again

    def make(self, pending: dict, has_blocks: bool, scalars: list, identity: tuple, worker: str, *,
             check_nonfinite: bool, observed: bool, ring_only: bool = False, placements: Optional[dict] = None,
             collections: Optional[bytes] = None, probe: object = None) -> FinishedStep:
        """The step's records, in recording order. ``pending``: key -> :class:`~.inbox.PendingEntry`;
        ``scalars``: ``(name, value, sm_metric, timestamp)``. ``observed``: fill :attr:`FinishedStep.values` for live rules (not for a
        step kept by the flight recorder only). ``placements``, ``collections``, ``probe``: as
        :class:`FinishedStep` holds them."""
        step, mode, mode_step = identity
        out = FinishedStep(identity, worker, ring_only=ring_only, placements=placements or {}, collections=collections,
                           probe=probe)
        tensors, shapes, tb_scalars, metrics = out.tensors, out.shapes, out.tb_scalars, out.metrics
        lists = (tensors, shapes, tb_scalars, out.tb_histograms, metrics)
        seen = StepValues(step, mode, mode_step, worker, {}, {}) if observed and not ring_only else None
        bad: Optional[List[str]] = [] if check_nonfinite else None
        if has_blocks:
            pending = self._resolve_duplicates(pending, step)
        # Tensors recorded one by one are materialized together, one backend call each.
        groups: Dict[TensorBackend, Tuple[List[Request], List[int]]] = {}
        entries = list(pending.values())
        for i, entry in enumerate(entries):
            if entry.kind is Kind.BLOCK:  # one extend for all its tensors
                block, values = entry.payload
                shapes += block.shapes
                tensors += zip(block.tags, values)
                if bad is not None and value_is_nonfinite(np.asarray(values, dtype=np.float64)):
                    bad += [one.name for one, _, vals in block.split(values)
                            if nonfinite_rows(np.asarray(vals, dtype=np.float64)[None], one.reductions) is not None]
                if seen is not None:
                    for one, _, values_of_one in block.split(values):
                        seen.reductions[one.name] = dict(zip(one.reductions, values_of_one))
            elif entry.kind is Kind.TENSOR:
                plan = entry.plan
                group = groups.get(entry.backend)
                if group is None:
                    group = groups[entry.backend] = ([], [])
                group[0].append(Request(plan.name, entry.payload, plan.needs_host, plan.shape, plan.reductions))
                group[1].append(i)
        materialized: Dict[int, Materialized] = {}
        for backend, (requests, positions) in groups.items():
            results = self._materialize(backend, requests, [entries[i].plan for i in positions])
            by_name = {plan.name: result for plan, result in results}
            materialized.update((i, by_name[entries[i].plan.name]) for i in positions
                                if entries[i].plan.name in by_name)
        for i, entry in enumerate(entries):
            if entry.kind is Kind.BATCH:
                self._emit_batch(entry.payload, identity, lists, seen, bad)
            elif entry.kind is Kind.DONE:
                self._emit_one(entry.plan, entry.payload, mode, lists, seen, bad)
            elif entry.kind is Kind.TENSOR and i in materialized:
                self._emit_one(entry.plan, materialized[i], mode, lists, seen, bad)
        scalars_from = (len(tensors), len(tb_scalars), len(metrics))

        for name, value, sm_metric, timestamp in scalars:
            array = np.asarray(self.numpy_scalar(value))
            if np.isscalar(value) and array.ndim == 0:
                array = array.reshape(1)  # a plain number reads back with shape (1,), as in 1.0.34
            tag = f"scalar/{name}"
            if timestamp is None:
                tensors.append((tag, array))
            else:  # its record carries the timestamp as wall_time (as in 1.0.34)
                out.timed.append((float(timestamp), tag, array))  # its own list: the step is not done yet
            if seen is not None:
                seen.tensors[tag] = array
            if bad is not None and value_is_nonfinite(array):
                bad.append(tag)
            if array.size == 1:
                if timestamp is None:  # a timed scalar's TensorBoard value goes with its own record
                    tb_scalars.append((tag, float(array.reshape(-1)[0])))
                if sm_metric:
                    metrics.append((f"{tag}_{mode.name}", float(array.reshape(-1)[0]), timestamp))
        return replace(out, scalars_from=scalars_from, nonfinite=bad, values=seen)

    def numpy_scalar(self, value):
        backend = self._backend_for(value)
        snap = backend.snapshot(value, False)
        return backend.materialize([Request("scalar", snap, raw=True, shape=False, reductions=())])[0].raw

    def skip_tensor(self, name: str, exc: Exception) -> None:
        """One warning naming the tensor; it is not recorded again (the failing part is
        disabled, not the hook, and later steps do not pay for the failure again)."""
        if name not in self.skipped:
            self.skipped.add(name)
            logger.warning("smdebug cannot save tensor %r (skipped from now on; the rest of the step is saved): "
                           "%s: %s", name, type(exc).__name__, exc)

    def _emit_one(self, plan: TensorPlan, result: Materialized, mode, out, seen, bad=None) -> None:
        self._emit(plan, result, mode, *out)
        if bad is not None and (reductions_nonfinite(result.reductions)
                                or (result.raw is not None and value_is_nonfinite(result.raw))):
            bad.append(plan.name)
        if seen is not None:
            if result.raw is not None:
                seen.tensors[plan.name] = result.raw
            if result.reductions:
                seen.reductions[plan.name] = result.reductions

    def _emit_batch(self, batch: TensorBatch, identity: tuple, out, seen, bad=None) -> None:
        """A batch's records: one ``extend`` for a batch of reductions (the common case), else
        tensor by tensor in the batch's order."""
        results = batch.results()
        if results is None:
            return  # the backend failed on it; the pipeline reported why
        selection = batch.selection
        tensors, shapes = out[0], out[1]
        if selection.fast_tags is not None and not (results[0].lost or results[0].unreduced):
            result = results[0]
            tensors.append(ScalarRun(selection.fast_tags, result.reductions))
            if bad is not None:  # one numpy call for the whole batch
                rows = nonfinite_rows(result.reductions, selection.groups[0][1])
                if rows is not None:
                    bad += [selection.plans[i].name for i in rows]
            if selection.plans[0].shape:
                shapes += zip([p.name for p in selection.plans], result.shapes)
            if seen is not None:
                for plan, row in zip(selection.plans, result.reductions):
                    seen.reductions[plan.name] = dict(zip(plan.reductions, row))
            return
        if bad is not None:
            self._nonfinite_in_batch(selection, results, bad)
        for plan, result in self._batch_items(batch, results, identity[0]):
            self._emit_one(plan, result, identity[1], out, seen)

    @staticmethod
    def _nonfinite_in_batch(selection: Selection, results: List[BatchResult], bad: List[str]) -> None:
        """Names of a batch's tensors holding NaN/Inf: from each group's reductions table (one
        numpy call), or from the host copies of a group saved without reductions."""
        for (positions, keys, raw, _), result in zip(selection.groups, results):
            skip = set(result.unreduced) | set(result.lost)
            if keys:
                rows = nonfinite_rows(result.reductions, keys)
                if rows is not None:
                    bad += [selection.plans[positions[j]].name for j in rows if j not in skip]
            elif raw and result.raw is not None:
                bad += [selection.plans[positions[j]].name for j, value in enumerate(result.raw)
                        if j not in skip and value is not None and value_is_nonfinite(value)]

    def _batch_items(self, batch: TensorBatch, results: List[BatchResult], step: int):
        """``(plan, Materialized)`` of each saved tensor of a batch, in the batch's order."""
        selection = batch.selection
        items: List[Optional[Tuple[TensorPlan, Materialized]]] = [None] * len(selection.plans)
        for (positions, keys, raw, _), result in zip(selection.groups, results):
            for j, pos in enumerate(positions):
                plan = selection.plans[pos]
                reason = result.lost.get(j)
                if reason is not None:
                    self._warn_lost(plan.name, step, reason)
                    continue
                reductions = {}
                if keys and j not in result.unreduced:
                    reductions = dict(zip(keys, result.reductions[j]))
                items[pos] = (plan, Materialized(raw=result.raw[j] if raw else None,
                                                 shape=result.shapes[j], reductions=reductions))
        return [item for item in items if item is not None]

    def _warn_lost(self, name: str, step: int, reason: str) -> None:
        if name not in self._warned_lost:
            self._warned_lost.add(name)
            logger.warning("smdebug: %s is not saved at step %d: %s (warned once per tensor)", name, step, reason)

    def _resolve_duplicates(self, pending: dict, step: int) -> dict:
        """``pending`` as it is, unless a name was recorded twice in the step by different
        calls (rare): then batches and blocks are split into their tensors and, for each
        name, the last record wins, as for tensors recorded one by one."""
        names: set = set()
        for entry in pending.values():
            if not names.isdisjoint(entry.names):
                break
            names.update(entry.names)
        else:
            return pending
        resolved: dict = {}
        for key, entry in pending.items():
            if entry.kind is Kind.BATCH:
                results = entry.payload.results()
                for one, result in (self._batch_items(entry.payload, results, step) if results else []):
                    resolved.pop(one.name, None)
                    resolved[one.name] = PendingEntry(Kind.DONE, result, one)
            elif entry.kind is Kind.BLOCK:
                block, values = entry.payload
                for one, shape, values_of_one in block.split(values):
                    resolved.pop(one.name, None)
                    resolved[one.name] = PendingEntry(Kind.BLOCK, (ReducedBlock([(one, shape)]), values_of_one))
            else:
                resolved.pop(key, None)
                resolved[key] = entry
        return resolved

    def _materialize(self, backend: TensorBackend, requests: List[Request], plans: List[TensorPlan]):
        """``(plan, result)`` per request, in one batch. When the batch fails, each tensor is
        tried alone: one the backend cannot handle is left out (:meth:`_skip_tensor`) and
        the rest of the step is saved. If several fail and none succeeds, the backend
        itself is broken: the error goes up (and disables the hook)."""
        try:
            return list(zip(plans, backend.materialize(requests)))
        except Exception as exc:  # noqa: BLE001 - find which tensor it was
            batch_error = exc
        out, failed = [], []
        if len(requests) == 1:
            failed.append((plans[0].name, batch_error))
        else:
            for request, plan in zip(requests, plans):
                try:
                    out.append((plan, backend.materialize([request])[0]))
                except Exception as exc:  # noqa: BLE001 - find which tensor it was
                    failed.append((plan.name, exc))
            if not out:
                raise batch_error
        for name, exc in failed:
            self.skip_tensor(name, exc)
        return out

    def _emit(self, plan: TensorPlan, result: Materialized, mode, tensors, shapes, tb_scalars, tb_hists,
              metrics) -> None:
        """Append one tensor's records in the original's order: shape, reductions, raw."""
        raw = result.raw
        if plan.shape and result.shape is not None:
            shapes.append((plan.name, tuple(result.shape)))
        reductions = result.reductions
        if reductions:
            if len(reductions) == len(plan.reductions):  # all of them, in the plan's order
                tensors += zip(plan.reduction_tags, map(np.asarray, reductions.values()))
            else:
                for (op, is_abs), value in reductions.items():
                    tensors.append((reduction_tag(plan.name, op, is_abs, self.strip), np.asarray(value)))
        if raw is None:
            return
        if plan.histogram_tag and raw.size and raw.dtype.kind in "iuf":
            tb_hists.append((plan.histogram_tag, raw))
        if plan.raw:
            if raw.size == 0:
                shapes.append((plan.name, tuple(raw.shape)))  # nothing to store but its shape
            else:
                tensors.append((plan.name, raw))
        if plan.tb_scalar and raw.size == 1 and raw.dtype.kind in "biuf":
            value = float(raw.reshape(-1)[0])
            tb_scalars.append((plan.name, value))
            if plan.sm_metric:
                # The step's own mode: the training thread may be in the next step, of another mode, by now.
                metrics.append((f"{plan.name}_{mode.name}", value, None))

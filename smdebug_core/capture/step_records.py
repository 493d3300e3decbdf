"""A finished step's records: what :class:`~smdebug.capture.session.StepSession` hands the writer at the end of
each saved step, made on the step pipeline's worker (or inline when that is cheaper).

A mixin of the step session, apart from its step and mode logic (``session.py``): it turns the
step's handed-over batches, single tensors and scalars into records in recording order
(raw values, reduction records, TensorBoard scalars and histograms, SageMaker metric
lines), resolves names saved twice, checks values for the flight recorder, and submits the
step to the writer (docs/architecture.md, "The data path").
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import config as cfg
from .backend import BatchResult, Materialized, Request, TensorBackend
from .flight_recorder import nonfinite_rows, value_is_nonfinite
from ..logger import get_logger
from ..reduction_config import reduction_tag
from .step import ReducedBlock, Selection, StepValues, TensorBatch, TensorPlan
from ..storage.step_data import ScalarRun

logger = get_logger()


class StepRecords:
    """The record-making half of the step session (see the module docstring)."""

    def _finish_step(self, pending: dict, has_blocks: bool, scalars: list, identity: tuple,
                     collections: Optional[bytes], flight: Optional[tuple] = None,
                     placements: Optional[Dict[str, dict]] = None) -> None:
        """On the pipeline's worker: the step's records, in recording order, to the writer.

        ``flight``: ``(ring_only, probe)`` while the flight recorder keeps steps: the step's
        values are checked for NaN/Inf (from its reductions, already on the host), and a step
        that saves nothing else goes to the recorder instead of the writer. ``placements``:
        name -> where a record sits in a larger (sharded) tensor (docs/format.md 3.3)."""
        step, mode, mode_step = identity
        tensors, shapes, tb_scalars, tb_hists, metrics = [], [], [], [], []
        out = (tensors, shapes, tb_scalars, tb_hists, metrics)
        strip = self.profile.strip_output_index_in_reduction_tags
        ring_only = flight is not None and flight[0]
        # Live rules see the steps that are saved, as without the recorder.
        seen = StepValues(step, mode, mode_step, self.worker_name, {}, {}) \
            if self._step_listeners and not ring_only else None
        bad: Optional[List[str]] = [] if flight is not None else None  # names of non-finite tensors
        if has_blocks:
            pending = self._resolve_duplicates(pending)
        # Tensors recorded one by one are materialized together, one backend call each.
        groups: Dict[TensorBackend, Tuple[List[Request], List[int]]] = {}
        entries = list(pending.values())
        for i, (plan, payload, backend) in enumerate(entries):
            if plan is None and isinstance(payload, tuple):  # a ReducedBlock: one extend for all its tensors
                block, values = payload
                shapes += block.shapes
                tensors += zip(block.tags, values)
                if bad is not None and value_is_nonfinite(np.asarray(values, dtype=np.float64)):
                    bad += [one.name for one, _, vals in block.split(values) if value_is_nonfinite(np.asarray(vals))]
                if seen is not None:
                    for one, _, values_of_one in block.split(values):
                        seen.reductions[one.name] = dict(zip(one.reductions, values_of_one))
            elif plan is not None and backend is not None:
                group = groups.get(backend)
                if group is None:
                    group = groups[backend] = ([], [])
                group[0].append(Request(plan.name, payload, plan.needs_host, plan.shape, plan.reductions))
                group[1].append(i)
        materialized: Dict[int, Materialized] = {}
        for backend, (requests, positions) in groups.items():
            results = self._materialize(backend, requests, [entries[i][0] for i in positions])
            by_name = {plan.name: result for plan, result in results}
            materialized.update((i, by_name[entries[i][0].name]) for i in positions
                                if entries[i][0].name in by_name)
        for i, (plan, payload, backend) in enumerate(entries):
            if isinstance(payload, TensorBatch):
                self._emit_batch(payload, identity, strip, out, seen, bad)
            elif plan is not None and (backend is None or i in materialized):
                self._emit_one(plan, payload if backend is None else materialized[i], strip, out, seen, bad)
        # Where the scalars' records start (a step kept by the recorder writes only those now).
        scalars_from = (len(tensors), len(tb_scalars), len(metrics))

        timed = []  # scalars given a timestamp: their records carry it as wall_time (as in 1.0.34)
        for name, value, sm_metric, timestamp in scalars:
            array = np.asarray(self._numpy_scalar(value))
            tag = f"scalar/{name}"
            if timestamp is None:
                tensors.append((tag, array))
            else:
                timed.append((float(timestamp), tag, array))
            if seen is not None:
                seen.tensors[tag] = array
            if bad is not None and value_is_nonfinite(array):
                bad.append(tag)
            if array.size == 1:
                if timestamp is None:  # a timed scalar's TensorBoard value goes with its own record
                    tb_scalars.append((tag, float(array.reshape(-1)[0])))
                if sm_metric:
                    metrics.append((f"{tag}_{mode.name}", float(array.reshape(-1)[0]), timestamp))

        # A kept step is kept, checked and its scalars submitted under the recorder's lock: a
        # fire from another thread (a rule, an exception) comes before or after, never between.
        with self._recorder.lock if flight is not None else contextlib.nullcontext():
            self._last_identity = identity
            if flight is not None:
                if ring_only:
                    # Kept whole (scalars too); now only the scalars are written, as without the recorder.
                    kept = tensors + [(tag, array) for _, tag, array in timed]
                    try:
                        self._recorder_keep(identity, kept, shapes, flight[1], placements)
                    except Exception as exc:  # noqa: BLE001 - costs the recorder, not the hook: this step is written
                        self._recorder.disable(f"keeping step {step}: {type(exc).__name__}: {exc}")
                        ring_only, bad = False, None
                    else:
                        tensors, shapes = tensors[scalars_from[0]:], []
                        tb_scalars, tb_hists, metrics = tb_scalars[scalars_from[1]:], [], metrics[scalars_from[2]:]
                else:
                    self._recorder.keep_saved(identity, flight[1])
            if metrics:
                self._write_sm_metrics(metrics, step)
            if bad:
                marker = self._recorder.fire("nonfinite", f"{bad[0]} holds NaN or Inf at step {step}", identity, bad,
                                             flight[1])
                if ring_only and marker is not None and step in marker["steps_written"]:
                    tensors, timed = [], []  # its scalars were written with the kept step
            writer = self.writer
            if writer is None:
                if self.dry_run:
                    logger.info("dry run: step %d (%s %d) would save %d records", step, mode.name, mode_step,
                                len(tensors) + len(shapes))
            elif writer.failed is not None:
                self._pipeline_failure = self._pipeline_failure or (f"writer failed: {writer.failed}", True)
                writer = None
            else:
                self._submit_step(writer, identity, tensors, shapes, tb_scalars, tb_hists, timed, placements,
                                  ring_only)
        # Outside the lock: a live rule's action may fire the recorder from the rules thread
        # while this thread waits for its verdict.
        if seen is not None:
            self._notify_listeners(seen)
        if writer is None:
            return
        if collections is not None:
            writer.write_collections(collections)
        if self._step_counters is not None and not ring_only:
            # Spot training: a run killed later still resumes after this step.
            self._save_step_counters(identity)

    def _submit_step(self, writer, identity, tensors, shapes, tb_scalars, tb_hists, timed, placements,
                     ring_only) -> None:
        """A finished step's records to the writer; timed scalars as records of their own."""
        from ..storage.step_data import StepData

        step, mode, mode_step = identity
        if tensors or shapes or not ring_only:  # a step kept by the recorder may have nothing to write now
            writer.submit(StepData(
                global_step=step, mode=mode, mode_step=mode_step, worker=self.worker_name, tensors=tensors,
                shapes=shapes, tb_scalars=tb_scalars, tb_histograms=tb_hists, wall_time=time.time(),
                placements=placements or {},
            ), publish=not timed)  # the step is complete: readers may see it as soon as it is on disk
        for i, (wall_time, tag, array) in enumerate(timed):  # same step, one record each with its time
            writer.submit(StepData(
                global_step=step, mode=mode, mode_step=mode_step, worker=self.worker_name, tensors=[(tag, array)],
                tb_scalars=[(tag, float(array.reshape(-1)[0]))] if array.size == 1 else [], wall_time=wall_time,
            ), publish=i == len(timed) - 1)

    def _emit_one(self, plan: TensorPlan, result: Materialized, strip: bool, out, seen, bad=None) -> None:
        self._emit(plan, result, strip, *out)
        if bad is not None and (any(value_is_nonfinite(v) for v in result.reductions.values())
                                or (result.raw is not None and value_is_nonfinite(result.raw))):
            bad.append(plan.name)
        if seen is not None:
            if result.raw is not None:
                seen.tensors[plan.name] = result.raw
            if result.reductions:
                seen.reductions[plan.name] = result.reductions

    def _emit_batch(self, batch: TensorBatch, identity: tuple, strip: bool, out, seen, bad=None) -> None:
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
                rows = nonfinite_rows(result.reductions)
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
            self._emit_one(plan, result, strip, out, seen)

    @staticmethod
    def _nonfinite_in_batch(selection: Selection, results: List[BatchResult], bad: List[str]) -> None:
        """Names of a batch's tensors holding NaN/Inf: from each group's reductions table (one
        numpy call), or from the host copies of a group saved without reductions."""
        for (positions, keys, raw, _), result in zip(selection.groups, results):
            skip = set(result.unreduced) | set(result.lost)
            if keys:
                rows = nonfinite_rows(result.reductions)
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

    def _resolve_duplicates(self, pending: dict) -> dict:
        """``pending`` as it is, unless a name was recorded twice in the step by different
        calls (rare): then blocks and batches are split into their tensors and, for each
        name, the last record wins, as for tensors recorded one by one."""
        names: set = set()
        for key, (plan, payload, _) in pending.items():
            if plan is not None:
                covered = (key,)
            elif isinstance(payload, TensorBatch):
                covered = payload.selection.names
            else:
                covered = payload[0].names
            if not names.isdisjoint(covered):
                break
            names.update(covered)
        else:
            return pending
        resolved: dict = {}
        for key, entry in pending.items():
            plan, payload, _ = entry
            if plan is not None:
                resolved.pop(key, None)
                resolved[key] = entry
            elif isinstance(payload, TensorBatch):
                results = payload.results()
                for one, result in (self._batch_items(payload, results, self.global_step) if results else []):
                    resolved.pop(one.name, None)
                    resolved[one.name] = (one, result, None)  # backend None: already materialized
            else:
                block, values = payload
                for one, shape, values_of_one in block.split(values):
                    resolved.pop(one.name, None)
                    resolved[one.name] = (None, (ReducedBlock([(one, shape)]), values_of_one), None)
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
                except Exception as exc:  # noqa: BLE001
                    failed.append((plan.name, exc))
            if not out:
                raise batch_error
        for name, exc in failed:
            self._skip_tensor(name, exc)
        return out

    def _skip_tensor(self, name: str, exc: Exception) -> None:
        """One warning naming the tensor; it is not recorded again (the failing part is
        disabled, not the hook, and later steps do not pay for the failure again)."""
        if name not in self._skipped_tensors:
            self._skipped_tensors.add(name)
            logger.warning("smdebug cannot save tensor %r (skipped from now on; the rest of the step is saved): "
                           "%s: %s", name, type(exc).__name__, exc)

    def _numpy_scalar(self, value):
        backend = self._backend_for(value)
        snap = backend.snapshot(value, False)
        return backend.materialize([Request("scalar", snap, raw=True, shape=False, reductions=())])[0].raw

    def _emit(self, plan: TensorPlan, result: Materialized, strip: bool, tensors, shapes, tb_scalars, tb_hists,
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
                    tensors.append((reduction_tag(plan.name, op, is_abs, strip), np.asarray(value)))
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
                metrics.append((f"{plan.name}_{self._step_identity[1].name}", value, None))

    def _write_sm_metrics(self, metrics, step) -> None:
        """SageMaker Metrics lines: appended by the writer thread (the training thread never
        waits on that file); a directory that cannot be written costs the lines (one warning),
        not the hook. Without a writer (dry runs), appended here."""
        directory = os.environ.get(cfg.METRICS_DIR_ENV)
        if not directory or self._metrics_failed:
            return
        path = os.path.join(directory, f"smdebug_{os.getpid()}.json")
        lines = [json.dumps({"MetricName": name, "Value": value, "Timestamp": timestamp or time.time(),
                             "IterationNumber": step}) for name, value, timestamp in metrics]
        writer = self.writer
        if writer is not None:
            for line in lines:
                writer.write_metric_line(path, line)
            return
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
        except OSError as exc:
            self._metrics_failed = True
            logger.warning("smdebug: cannot write SageMaker metric lines to %s=%s (%s); tensors are still saved, "
                           "metric lines are not", cfg.METRICS_DIR_ENV, directory, exc.strerror or exc)

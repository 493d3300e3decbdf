"""TorchBackend: the core's tensor contract for ``torch.Tensor``.

Reductions (``min``, ``max``, ``mean``, ``std``, ``variance``, ``sum``, ``prod``,
``median``, ``l1``, ``l2``, the health reductions, and their ``abs_`` forms) are computed
where the tensors lie, in a few whole-batch calls, and cross to the host once. Every path
only produces the partial columns of :mod:`smdebug.reduction_columns` in its own segments
(rows, flat or device segments, one tensor, one value each), finished by its one finisher.

**CPU tensors** (:func:`_finish_cpu_batch`, for batches and for tensors recorded one by one):
tensors of one dtype and shape are stacked into a buffer kept between steps and reduced
as the rows of one array, in float64 (:func:`reduce_rows`): numpy for small groups, torch's
min/max, sums and norms for large ones (calls that release the GIL: large
batches run on the step pipeline's worker, small ones at hand-over; see
:meth:`TorchBackend.finish_here` and docs/performance.md). ``start_batch`` only notes
references and version counters; a tensor changed in place before it was read is reported
lost, never saved half-updated.

**Accelerator tensors** (CUDA): reductions and host copies are launched at hand-over, in
stream order, so nothing the training enqueues later can change what they read; the worker
waits for the one transfer per device. Small tensors are concatenated into one float64
buffer per device and reduced with ``torch.segment_reduce`` (one kernel per reduction kind);
large ones in place with fused kernels (:data:`BATCH_MAX_NUMEL`); ``median`` per tensor.

Definitions are those of :mod:`smdebug.reductions`: population ``std`` and ``variance``,
norms of the flattened tensor, complex tensors reduced by magnitude. Raw values are copied
bit-exactly (bfloat16 and float8 as ``ml_dtypes`` arrays); CUDA copies go through pinned
host memory with ``non_blocking=True`` and one synchronisation.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import Dict, List, Optional, Sequence, Tuple, cast

import ml_dtypes
import numpy as np
import torch

from torch._utils import _flatten_dense_tensors

from smdebug.capture.backend import BatchResult, Materialized, Request, TensorBackend, pack_results
from smdebug.reduction_columns import (Segments, columns_for, finish, flat_columns, health_of,
                                       health_partials)

from . import host_reductions as host
from .host_reductions import (FLOAT64_SOURCES, BufferPool, ReductionKey, as_rows, reduce_rows, reduce_values,
                              row_columns)


#: Tensors with at most this many elements are concatenated and reduced together; bigger
#: ones are reduced in place. CPU: below ~8K elements the per-call dispatch cost (~5 us)
#: outweighs the copy; CUDA: a launch costs as much as reducing millions of elements.
BATCH_MAX_NUMEL = {"cpu": 8192, "cuda": 1 << 22}
_DEFAULT_BATCH_MAX_NUMEL = 8192
#: CPU tensors are reduced by stacking those of one dtype and shape and reducing rows
#: (:func:`_finish_cpu_batch`), whether recorded one by one or handed over in batches. False
#: sends them through the accelerators' path (segment ops) instead: tests use it to run
#: that path on CPU tensors.
CPU_ROWS = True
#: Upper bound on one concatenation buffer (float64 elements): bounds temporary memory.
CHUNK_MAX_NUMEL = 1 << 24
#: CPU batches of fewer elements are reduced on the training thread when handed over, bigger
#: ones on the step pipeline's worker. Each call the worker makes into torch or numpy hands
#: the GIL back and forth with a training thread that runs Python, and each hand-over costs
#: the training thread a thread wake-up (100-300 us on the 2-core VM the benchmarks ran on):
#: a batch whose kernels take less than a few of those costs less done at once. Measured
#: with bench_scaling.py (docs/performance.md): thresholds of 0 and 50k elements did equally
#: well, 200k worse and 1M worse still, on every scenario.
WORKER_MIN_NUMEL = 1 << 16
#: Batches finished on the worker thread (CPU): tensors of one dtype and size up to this many
#: elements are stacked into one ``[n, size]`` array and reduced with one numpy call per
#: reduction; bigger ones are reduced alone, through a ``[1, size]`` view (no copy).
STACK_MAX_NUMEL = 1 << 16
#: ... and one stack holds at most this many elements (bounds the worker's temporary memory).
STACK_MAX_TOTAL = 1 << 22

_NUMPY_VIEW_DTYPES = {torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16))}
for _torch_name, _ml_name in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
                              ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float8_e5m2fnuz", "float8_e5m2fnuz"),
                              ("float8_e8m0fnu", "float8_e8m0fnu")):
    if hasattr(torch, _torch_name) and hasattr(ml_dtypes, _ml_name):
        _NUMPY_VIEW_DTYPES[getattr(torch, _torch_name)] = (torch.uint8, np.dtype(getattr(ml_dtypes, _ml_name)))

# Dtypes whose strided tensors need no conversion (complex ones may carry a conj bit).
_PLAIN_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                           torch.int16, torch.int8, torch.uint8, torch.bool})
# Dtypes torch.cat cannot convert while it concatenates ("Promotion for Float8 Types is not
# supported"): upcast one by one before a batch (see _reduce_segments, the accelerators' path).
_UPCAST_BEFORE_CAT = frozenset(getattr(torch, n) for n in dir(torch)
                               if n.startswith(("float8_", "float4_")) and isinstance(getattr(torch, n), torch.dtype))


class TorchSnapshot:
    """A recorded tensor, kept until the end of the step.

    ``owned``: ``tensor`` is a private copy (nothing else can change it). ``host``: the
    raw value already copied to the host (pinned CPU tensor for a CUDA source).
    ``reduced``: reductions computed when the tensor was captured, as
    ``(keys, device tensor of results)``.
    """

    __slots__ = ("tensor", "owned", "host", "reduced")

    def __init__(self, tensor: torch.Tensor, owned: bool, host: Optional[torch.Tensor] = None,
                 reduced: Optional[Tuple[Tuple[ReductionKey, ...], torch.Tensor]] = None):
        self.tensor = tensor
        self.owned = owned
        self.host = host
        self.reduced = reduced

    def __repr__(self):
        return (f"TorchSnapshot(shape={tuple(self.tensor.shape)}, dtype={self.tensor.dtype}, "
                f"device={self.tensor.device}, owned={self.owned})")


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """``value`` detached, as a dense strided tensor of a dtype we can reduce and save."""
    t = value.detach()
    if t.dtype in _PLAIN_DTYPES and t.layout is torch.strided and not t.is_neg():
        return t  # the common case, decided in three checks
    if t.is_quantized:
        t = t.dequantize()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.complex32:
        t = t.to(torch.complex64)
    return t


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in FLOAT64_SOURCES else torch.float32


def _as_real(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a real floating tensor of ``dtype`` (complex: magnitude), copying only if needed."""
    if t.is_complex():
        t = t.abs()
    return t if t.dtype == dtype else t.to(dtype)


class TorchBackend(TensorBackend):
    """Batched device reductions and host copies for ``torch.Tensor`` values."""

    name = "torch"

    def __init__(self):
        # Segment-length tensors, reused from step to step (the same tensors are saved each
        # time): avoids a host-to-device copy, which on CUDA would wait for queued work.
        self._lengths_cache: Dict[Tuple[str, Tuple[int, ...]], Tuple[torch.Tensor, torch.Tensor]] = {}
        self._stack_buffers = BufferPool()

    def accepts(self, value) -> bool:
        return isinstance(value, torch.Tensor)

    # --- capture --------------------------------------------------------------------
    def snapshot(self, value, needs_copy: bool):
        if isinstance(value, TorchSnapshot):
            return value
        t = plain_tensor(value)
        if t.is_meta or t.is_nested:  # the session skips the tensor, with one warning naming it
            raise ValueError(f"{'meta' if t.is_meta else 'nested'} tensors hold no values to copy")
        if needs_copy:
            return TorchSnapshot(t.clone(), owned=True)
        return TorchSnapshot(t, owned=False)

    def capture(self, items: Sequence[Tuple[torch.Tensor, bool, Tuple[ReductionKey, ...]]]) -> List[TorchSnapshot]:
        """Snapshot many tensors at once, reducing them now (batched) instead of copying them.

        ``items`` are ``(tensor, needs_raw, reductions)``. Use it where tensors are about to
        change (parameters before ``optimizer.step()``): reductions are computed from the
        current values and only tensors whose raw value is saved are copied (CPU: a clone;
        CUDA: an asynchronous copy into pinned host memory).
        """
        tensors = [plain_tensor(t) for t, _, _ in items]
        snaps = []
        for t, (_, raw, _) in zip(tensors, items):
            if not raw:
                snaps.append(TorchSnapshot(t, owned=False))
            elif t.device.type == "cpu":
                snaps.append(TorchSnapshot(t.clone(), owned=True))
            else:
                snaps.append(TorchSnapshot(t, owned=False, host=self._start_host_copy(t)))
        jobs = [(t, self._reducible(keys, t)) for t, (_, _, keys) in zip(tensors, items)]
        for snap, reduced in zip(snaps, self._reduce_all(jobs)):
            snap.reduced = reduced
        return snaps

    # --- batches (the hot path): references now, work on the step pipeline's worker ---------
    def start_batch(self, tensors: Sequence[torch.Tensor], keys: Tuple[ReductionKey, ...], raw: bool):
        """Training thread. CPU tensors: only references and version counters (the worker
        reads them before the adapter's fence). Accelerator tensors: their reductions and
        host copies are launched now, in stream order, before anything can change them;
        the worker only waits for the results."""
        if all(map(_IS_CPU, tensors)):  # the common case: two C-level passes, no per-tensor Python
            return _CpuBatch(tensors, list(map(_VERSION, tensors)), keys, raw)
        snaps = self.capture([(t, raw, keys) for t in tensors])
        return _DeviceBatch(snaps, keys, raw)

    def finish_here(self, started) -> bool:
        """Small CPU batches are finished on the training thread at once (see
        :data:`WORKER_MIN_NUMEL`); device batches always on the worker, which waits for the
        device so that the training thread never does."""
        if isinstance(started, _DeviceBatch):
            return False
        return sum(map(torch.Tensor.numel, started.tensors)) < WORKER_MIN_NUMEL

    def finish_batch(self, started) -> BatchResult:
        """Worker thread: a batch's results (see :meth:`start_batch`)."""
        if isinstance(started, _DeviceBatch):
            results = self.materialize([Request("", snap, started.raw, True, started.keys)
                                        for snap in started.snaps])
            return pack_results(results, started.keys, started.raw)
        return _finish_cpu_batch(started, self._stack_buffers)

    # --- materialize -------------------------------------------------------------------
    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        snaps: List[TorchSnapshot] = []
        hosts: List[Optional[torch.Tensor]] = []
        reduced: List[Optional[Tuple[Tuple[ReductionKey, ...], torch.Tensor]]] = []
        jobs, job_index = [], []
        cuda_devices = set()
        # One pass over the requests (a step may hold hundreds of small tensors):
        for i, req in enumerate(requests):
            snap = req.value if type(req.value) is TorchSnapshot else self.snapshot(req.value, False)
            snaps.append(snap)
            t = snap.tensor
            # 1. start every device-to-host copy of raw values (asynchronous on CUDA);
            host = None
            if req.raw:
                host = snap.host
                if host is None:
                    host = (t if snap.owned else t.clone()) if t.is_cpu else self._start_host_copy(t)
                if t.is_cuda:
                    cuda_devices.add(t.device)
            hosts.append(host)
            # 2. note the reductions not computed at capture (an empty tensor has none, as in numpy).
            red = snap.reduced
            if req.reductions and t.numel() and (red is None or not set(req.reductions) <= set(red[0])):
                jobs.append((t, tuple(req.reductions)))
                job_index.append(i)
            reduced.append(red)
        for i, result in zip(job_index, self._reduce_jobs(jobs)):
            reduced[i] = result
        # 3. One transfer of all reduction results per device (this also waits for the
        #    copies started in step 1 on that device's stream).
        if any(r is not None for r in reduced):
            host_results = self._results_to_host([r[1] if r is not None else None for r in reduced])
        else:
            host_results = [None] * len(reduced)
        self._synchronize(cuda_devices)
        out = []
        for req, snap, host, red, values in zip(requests, snaps, hosts, reduced, host_results):
            result = Materialized(raw=None if host is None else _to_numpy(host),
                                  shape=tuple(snap.tensor.shape) if req.shape else None)
            if red is not None and values is not None:
                by_key = dict(zip(red[0], values))
                result.reductions = {k: np.asarray(by_key[k], dtype=np.float64)
                                     for k in req.reductions if k in by_key}
            out.append(result)
        return out

    def _reduce_jobs(self, jobs: Sequence[Tuple[torch.Tensor, Tuple[ReductionKey, ...]]]):
        """Per job ``(keys, float64 result vector)``: CPU tensors through the same row
        reductions as CPU batches (:func:`_finish_cpu_batch`), others through the device path."""
        if not CPU_ROWS:
            return self._reduce_all(jobs)
        results: List[Optional[Tuple[Tuple[ReductionKey, ...], torch.Tensor]]] = [None] * len(jobs)
        device_jobs, device_index = [], []
        by_keys: Dict[Tuple[ReductionKey, ...], List[int]] = {}
        for i, (t, keys) in enumerate(jobs):
            if t.is_cpu:
                by_keys.setdefault(keys, []).append(i)
            else:
                device_jobs.append((t, keys))
                device_index.append(i)
        for keys, indices in by_keys.items():
            tensors = [jobs[i][0] for i in indices]
            result = _finish_cpu_batch(_CpuBatch(tensors, [t._version for t in tensors], keys, False),
                                       self._stack_buffers)
            if result.lost:  # the hook retries tensor by tensor and skips the one that fails
                raise ValueError("; ".join(f"tensor {pos}: {why}" for pos, why in sorted(result.lost.items())))
            table = result.reductions
            assert table is not None  # a job always has keys, so its batch has a table
            for i, row in zip(indices, table):
                results[i] = (keys, torch.from_numpy(row))
        for i, result in zip(device_index, self._reduce_all(device_jobs)):
            results[i] = result
        return results

    def partial_columns(self, tensors: Sequence[torch.Tensor], needed: Tuple[str, ...]) -> np.ndarray:
        """``[len(tensors), len(needed)]`` float64: the partial columns (:mod:`smdebug.reduction_columns`)
        of each non-empty tensor, computed where it lies, one transfer per device. For pieces
        of a sharded tensor, combined later. CPU tensors go through the CPU strategies: small
        ones of one dtype as segments of one flat copy, others as a batch's are (:func:`_stack_plan`)."""
        out: List[Optional[torch.Tensor]] = [None] * len(tensors)
        with torch.no_grad():
            tensors = [plain_tensor(t) for t in tensors]
            cpu = [i for i, t in enumerate(tensors) if t.is_cpu and CPU_ROWS]
            plan = host.segment_plan(tuple(tensors[i].dtype for i in cpu), tuple(tuple(tensors[i].shape) for i in cpu))
            if plan is not None and plan is not host.ONE_VALUE_EACH:
                columns = flat_columns(_flatten_dense_tensors([tensors[i] for i in cpu]).numpy().astype(np.float64),
                                       plan, needed)
                groups = [(cpu, columns)]
            else:  # stacked as a batch's tensors are (_stack_plan: capped copies, large ones where they lie)
                chunks, _ = _stack_plan(tuple(tensors[i].dtype for i in cpu), tuple(tuple(tensors[i].shape) for i in cpu))
                groups = []
                for chunk in chunks:
                    members = [cpu[k] for k in chunk]
                    stacked = tensors[members[0]].reshape(1, -1) if len(members) == 1 \
                        else torch.stack([tensors[i].reshape(-1) for i in members])
                    groups.append((members, row_columns(as_rows(stacked), needed, self._stack_buffers)))
            for members, columns in groups:
                table = np.stack([np.asarray(columns[c], dtype=np.float64).reshape(-1) for c in needed], axis=1)
                for row, i in enumerate(members):
                    out[i] = torch.from_numpy(table[row])
            for i, t in enumerate(tensors):
                if out[i] is None:
                    own = _one_columns(t, needed)
                    out[i] = torch.stack([torch.as_tensor(own[c], dtype=torch.float64, device=t.device).reshape(())
                                          for c in needed])
        # every position holds a result now, so every host vector is there
        return np.stack(cast(List[np.ndarray], self._results_to_host(out))) if out else np.empty((0, len(needed)))

    @staticmethod
    def _reducible(keys, t: torch.Tensor) -> Tuple[ReductionKey, ...]:
        # Like the numpy reference: an empty tensor has no reductions.
        return tuple(keys) if keys and t.numel() else ()

    @staticmethod
    def _start_host_copy(t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=torch.cuda.is_available())
        host.copy_(t, non_blocking=True)
        return host

    @staticmethod
    def _synchronize(devices) -> None:
        for device in devices:
            torch.cuda.current_stream(device).synchronize()

    def _results_to_host(self, results: List[Optional[torch.Tensor]]) -> List[Optional[np.ndarray]]:
        """Move every result vector to the host: one concatenation and one copy per device."""
        by_device: Dict[torch.device, List[int]] = {}
        for i, r in enumerate(results):
            if r is not None:
                by_device.setdefault(r.device, []).append(i)
        out: List[Optional[np.ndarray]] = [None] * len(results)
        for device, indices in by_device.items():
            parts = [cast(torch.Tensor, results[i]) for i in indices]  # the results that are there
            flat = torch.cat(parts) if len(parts) > 1 else parts[0]
            host = flat.cpu().numpy()  # the single device-to-host transfer of this device's results
            offset = 0
            for i, part in zip(indices, parts):
                out[i] = host[offset:offset + part.numel()]
                offset += part.numel()
        return out

    # --- the reductions ------------------------------------------------------------------
    def _reduce_all(self, jobs: Sequence[Tuple[torch.Tensor, Tuple[ReductionKey, ...]]]):
        """Per job, ``(keys, float64 result vector on the tensor's device)``; None if no keys."""
        results: List[Optional[Tuple[Tuple[ReductionKey, ...], torch.Tensor]]] = [None] * len(jobs)
        batches: Dict[Tuple[torch.device, Tuple[ReductionKey, ...]], List[int]] = {}
        for i, (t, keys) in enumerate(jobs):
            if not keys:
                continue
            batched_keys = _split_median(keys)[0]
            limit = BATCH_MAX_NUMEL.get(t.device.type, _DEFAULT_BATCH_MAX_NUMEL)
            if batched_keys and t.numel() <= limit:
                batches.setdefault((t.device, batched_keys), []).append(i)
            else:
                results[i] = (keys, _reduce_one(t, keys))
        for (device, keys), indices in batches.items():
            chunk: List[int] = []
            size = 0
            for job in indices + [None]:  # None: the end, which reduces the last chunk
                n = jobs[job][0].numel() if job is not None else 0
                if chunk and (job is None or size + n > CHUNK_MAX_NUMEL):
                    values = self._reduce_segments([jobs[j][0] for j in chunk], keys, device)  # [keys, tensors]
                    for j, vector in zip(chunk, values.t().unbind(0)):
                        t, all_keys = jobs[j]
                        extra = _split_median(all_keys)[1]
                        if extra:  # the rare sort-based reduction is added per tensor
                            vector = torch.cat([vector, _reduce_one(t, extra)])
                            results[j] = (keys + extra, vector)
                        else:
                            results[j] = (keys, vector)
                    chunk, size = [], 0
                if job is not None:
                    chunk.append(job)
                    size += n
        return results

    def _lengths(self, sizes: List[int], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        key = (str(device), tuple(sizes))
        hit = self._lengths_cache.get(key)
        if hit is None:
            if len(self._lengths_cache) > 64:
                self._lengths_cache.clear()
            lengths = torch.tensor(sizes, dtype=torch.int64)
            if device.type != "cpu":
                lengths = lengths.pin_memory().to(device, non_blocking=True)
            hit = (lengths, lengths.to(torch.float64))
            self._lengths_cache[key] = hit
        return hit

    def _reduce_segments(self, tensors: List[torch.Tensor], keys: Tuple[ReductionKey, ...],
                         device: torch.device) -> torch.Tensor:
        """All ``keys`` of all ``tensors`` (same device) with one kernel per reduction kind.

        Returns a float64 tensor of shape ``[len(keys), len(tensors)]``.
        """
        sizes = [t.numel() for t in tensors]
        # Per tensor, where cat cannot convert: complex (magnitude) and float8 (upcast).
        flat = [(_as_real(t, torch.float64) if t.is_complex() or t.dtype in _UPCAST_BEFORE_CAT else t).reshape(-1)
                for t in tensors]
        x = torch.empty(sum(sizes), dtype=torch.float64, device=device)
        torch.cat(flat, out=x)  # one kernel: gathers and casts to float64
        lengths, counts = self._lengths(sizes, device)
        return torch.stack(finish(_segment_columns(x, lengths, counts, columns_for(keys)), keys, torch.sqrt))


def _segment_columns(x: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor, needed: Tuple[str, ...]
                     ) -> Dict[str, torch.Tensor]:
    """The ``needed`` partial columns of each segment of the flat float64 tensor ``x``, one
    ``segment_reduce`` per kind of pass (two-pass variances; median is computed per tensor,
    :func:`_split_median`). Straight-line code: no closure keeps ``x`` alive after the call."""
    want = set(needed)
    got: Dict[str, torch.Tensor] = {"count": counts}
    health = health_of(needed)
    if health:
        got.update(health_partials(x, health, Segments(
            counts, lambda a: torch.segment_reduce(a.to(torch.float64), "sum", lengths=lengths, unsafe=True),
            lambda v: torch.repeat_interleave(v, lengths, output_size=x.numel()), torch)))
    if "sum_sq" in want:
        got["sum_sq"] = torch.segment_reduce(x.square(), "sum", lengths=lengths, unsafe=True)
    magnitudes = x.abs() if any(c.endswith("_abs") for c in want) else None
    for a, src in (("", x), ("_abs", magnitudes)):
        if src is None:
            continue
        for base in ("sum", "min", "max", "prod"):
            if base + a in want or (base == "sum" and "var" + a in want):
                got[base + a] = torch.segment_reduce(src, base, lengths=lengths, unsafe=True)
        if "var" + a in want:
            centered = src - torch.repeat_interleave(got["sum" + a] / counts, lengths, output_size=src.numel())
            got["var" + a] = torch.segment_reduce(centered.square_(), "sum", lengths=lengths, unsafe=True) / counts
    return got


@functools.lru_cache(maxsize=256)
def _split_median(keys: Tuple[ReductionKey, ...]) -> Tuple[Tuple[ReductionKey, ...], Tuple[ReductionKey, ...]]:
    """(keys computed in batches, the median keys computed per tensor)."""
    return tuple(k for k in keys if k[0] != "median"), tuple(k for k in keys if k[0] == "median")


def _reduce_one(t: torch.Tensor, keys: Tuple[ReductionKey, ...]) -> torch.Tensor:
    """``keys`` of one tensor from its columns (:func:`_one_columns`), as a float64 vector on its device."""
    return torch.stack(finish(_one_columns(t, columns_for(keys)), keys, torch.sqrt)).to(torch.float64)  # stack promotes


def _one_columns(t: torch.Tensor, needed: Tuple[str, ...]) -> Dict[str, object]:
    """The ``needed`` partial columns of one tensor with a few whole-tensor kernels, 0-d tensors
    on its device in its compute dtype (``count``: a number, so float32 means stay float32).

    Measured on CPU (100K float32): ``aminmax``, ``sum``, ``linalg.vector_norm`` and
    ``abs().sum()`` take 10-20 us each; ``var_mean`` (Welford) and ``vector_norm(ord=1)``
    5-40x longer, so variance is two-pass (``||x - mean||^2 / n``) and l1 is ``|x|.sum()``.
    """
    x = _as_real(t, _compute_dtype(t.dtype))
    n = x.numel()
    want = set(needed)
    got: Dict[str, object] = {}
    health = health_of(needed)
    if health:
        partials = health_partials(x.reshape(1, -1).to(torch.float64), health, Segments(
            torch.full((1,), float(n), dtype=torch.float64, device=x.device), _row_sums, _per_row, torch))
        got.update({name: value.reshape(()) for name, value in partials.items()})
    got["count"] = float(n)
    if "sum_sq" in want:  # the norm squared in float64: its square root is the norm, exactly
        got["sum_sq"] = torch.linalg.vector_norm(x, 2).to(torch.float64).square()
    magnitudes = x.abs() if any(c.endswith("_abs") for c in want) else None
    for a, src in (("", x), ("_abs", magnitudes)):
        if src is None:
            continue
        if "min" + a in want or "max" + a in want:
            got["min" + a], got["max" + a] = torch.aminmax(src)
        if "sum" + a in want or "var" + a in want:
            got["sum" + a] = src.sum()
        if "var" + a in want:
            got["var" + a] = torch.linalg.vector_norm(src - got["sum" + a] / n).square() / n
        if "prod" + a in want:
            p = x.prod(dtype=torch.float64)
            got["prod" + a] = p.abs() if a else p
        if "median" + a in want:
            got["median" + a] = _median(src)
    return got


def _row_sums(a: torch.Tensor) -> torch.Tensor:
    return a.sum(dim=1, dtype=torch.float64)


def _per_row(v: torch.Tensor) -> torch.Tensor:
    return v[:, None]


def _median(x: torch.Tensor) -> torch.Tensor:
    """numpy's median: the mean of the two middle values for an even count; NaN if any NaN."""
    flat = x.reshape(-1).to(torch.float64)
    ordered = torch.sort(flat).values  # NaN sorts last
    n = flat.numel()
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return torch.where(torch.isnan(ordered[-1]), ordered[-1], middle)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as numpy, bit-exact (bfloat16/float8 through ``ml_dtypes`` views)."""
    view = _NUMPY_VIEW_DTYPES.get(t.dtype)
    if view is not None:
        int_dtype, np_dtype = view
        return t.view(int_dtype).numpy().view(np_dtype)
    return t.numpy()


class _CpuBatch:
    """CPU tensors handed over by reference, with their version counters at hand-over."""

    __slots__ = ("tensors", "versions", "keys", "raw")

    def __init__(self, tensors, versions, keys, raw):
        self.tensors, self.versions, self.keys, self.raw = tensors, versions, keys, raw


class _DeviceBatch:
    __slots__ = ("snaps", "keys", "raw")

    def __init__(self, snaps, keys, raw):
        self.snaps, self.keys, self.raw = snaps, keys, raw


def _finish_cpu_batch(batch: _CpuBatch, buffers: "BufferPool") -> BatchResult:
    """Reduce and copy a batch of CPU tensors on the worker thread.

    Tensors of one dtype and shape are stacked and reduced together (:func:`reduce_rows`: a
    few numpy calls whatever their number; numpy releases the GIL inside them). A tensor the
    batch cannot handle (meta, nested, a dtype numpy has no view of) is lost with its
    reason, alone. Version counters are compared last: a tensor changed in place since the
    hand-over may have been read half-updated, so it is not saved.
    """
    with torch.no_grad():  # stacks and copies of parameters record no autograd graph: no detach needed
        return _finish_cpu_batch_no_grad(batch, buffers)


def _finish_cpu_batch_no_grad(batch: _CpuBatch, buffers: "BufferPool") -> BatchResult:
    keys, tensors, raw = batch.keys, batch.tensors, batch.raw
    n = len(tensors)
    raws: Optional[List[Optional[np.ndarray]]] = [None] * n if raw else None
    # C-level passes over the tensors: this thread holds the GIL for its Python, and the
    # training thread waits for it (a batch may hold hundreds of small tensors).
    shapes = list(map(tuple, map(_SHAPE, tensors)))
    signature = (tuple(map(_DTYPE, tensors)), tuple(shapes))  # the plans' cache key
    lost: Dict[int, str] = {}
    table = None
    if not raw and keys:
        segments = host.segment_plan(*signature)
        if segments is host.ONE_VALUE_EACH:  # a step's losses and metrics: no numpy at all
            try:
                table = reduce_values([t.item() for t in tensors], keys)
            except Exception:  # noqa: BLE001 - the general path below reads them one at a time
                table = None
        elif segments is not None:
            try:
                table = host.reduce_segments(tensors, segments, keys)
            except Exception:  # noqa: BLE001 - the general path below reads them one group at a time
                table = None
    chunks: Tuple[List[int], ...]  # as _stack_plan gives them
    unreduced: Tuple[int, ...]
    if table is not None:
        chunks, unreduced = (), ()
    else:
        table = np.full((n, len(keys)), np.nan) if keys else None
        chunks, unreduced = _stack_plan(*signature)
    for chunk in chunks:
        try:
            _finish_group([tensors[i] for i in chunk], chunk, keys, raws, table, buffers)
        except Exception:  # noqa: BLE001 - retried one by one below: one bad tensor, one loss
            for i in chunk:
                try:
                    _finish_group([plain_tensor(tensors[i])], [i], keys, raws, table, buffers)
                except Exception as exc:  # noqa: BLE001 - the tensor is lost for this step, with the reason
                    lost[i] = f"cannot read it ({type(exc).__name__}: {exc})"
    if list(map(_VERSION, tensors)) != batch.versions:
        for i, (t, version) in enumerate(zip(tensors, batch.versions)):
            if t._version != version and i not in lost:
                lost[i] = "it was changed in place between the hand-over and its reading"
    return BatchResult(reductions=table, raw=raws, shapes=shapes, unreduced=unreduced, lost=lost)


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_VERSION = operator.attrgetter("_version")
_IS_CPU = operator.attrgetter("is_cpu")


@functools.lru_cache(maxsize=256)
def _stack_plan(dtypes: tuple, shapes: tuple) -> Tuple[Tuple[List[int], ...], Tuple[int, ...]]:
    """How a batch of tensors of these dtypes and shapes is read (the same every step of a
    run): chunks of positions stacked together, and the positions of empty tensors.

    Tensors of one dtype and shape are stacked once: one copy serves their raw values and
    their reductions. Large tensors are read where they lie (copied only for raw values)."""
    groups: Dict[tuple, List[int]] = {}
    unreduced = []
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        numel = math.prod(shape)
        if numel == 0:
            unreduced.append(i)
        groups.setdefault((dtype, shape) if 0 < numel <= STACK_MAX_NUMEL else (i,), []).append(i)
    chunks = []
    for members in groups.values():
        per_stack = max(1, STACK_MAX_TOTAL // max(1, math.prod(shapes[members[0]])))
        chunks += [members[start:start + per_stack] for start in range(0, len(members), per_stack)]
    return tuple(chunks), tuple(unreduced)


def _finish_group(group: List[torch.Tensor], positions: List[int], keys, raws, table, buffers) -> None:
    """Raw values and reductions of tensors of one dtype and shape (or one tensor)."""
    reused = None
    if len(group) == 1:
        stacked = group[0].reshape((1,) + tuple(group[0].shape))
        if raws is not None:
            stacked = plain_tensor(stacked).clone()  # private: the tensor may change after the fence
    elif raws is None:  # only read here: a buffer kept from the last step (no fresh pages)
        reused = stacked = buffers.take(group[0].dtype, (len(group),) + tuple(group[0].shape))
        torch.stack(group, out=stacked)
    else:
        stacked = torch.stack(group)  # a private copy: the writer reads it later
    try:
        if raws is not None:
            host = _to_numpy(stacked)
            for j, i in enumerate(positions):
                raws[i] = host[j]
        if keys and stacked.numel():
            table[positions] = reduce_rows(as_rows(stacked), keys, buffers)
    finally:
        if reused is not None:
            buffers.give(reused)

"""Reductions of CPU tensors on the host, the strategies of the PyTorch backend's CPU path.

* :func:`reduce_rows`: every row of a ``[n, size]`` tensor (tensors of one dtype and shape
  stacked): torch's min/max and float64-accumulating sums and norms for large groups (calls
  that release the GIL), numpy for small ones (:func:`reduce_flat`);
* :func:`reduce_flat`: each segment of one flat float64 copy (a batch of small tensors);
* :func:`reduce_values`: one-element tensors given as their values, in plain Python.

Definitions are those of :mod:`smdebug.reductions`; health reductions come from its partials
(:func:`lazy_health`). The backend (backend.py) decides which strategy reads a batch.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors

from smdebug import reductions as reference

from .row_health import health_of_rows, scratch_blocks

ReductionKey = Tuple[str, bool]
HEALTH = frozenset(reference.HEALTH_REDUCTIONS)
#: Dtypes whose rows are reduced in float64 (widened losslessly); others in float32.
FLOAT64_SOURCES = frozenset({torch.float64, torch.int64, torch.int32, torch.complex128}
                            | {getattr(torch, n) for n in ("uint32", "uint64") if hasattr(torch, n)})


def lazy_health(keys: Tuple[ReductionKey, ...], partials_of):
    """``health(op, is_abs)``: a health reduction of every segment, from partials computed
    once, on first use, by ``partials_of(columns)`` (see :func:`smdebug.reductions.health_partials`)."""
    partials = None

    def health(op: str, is_abs: bool):
        nonlocal partials
        if partials is None:
            partials = partials_of(reference.health_columns(keys))
        return reference.finish_health(partials, op, is_abs)
    return health


def segments(lengths: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths as float64)`` of consecutive segments, read-only (they are cached)."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.intp)
    lengths = lengths.astype(np.float64)
    starts.setflags(write=False)
    lengths.setflags(write=False)
    return starts, lengths


@functools.lru_cache(maxsize=64)
def row_segments(rows: int, size: int) -> Tuple[np.ndarray, np.ndarray]:
    return segments(np.full(rows, size, np.int64))


def reduce_flat(wide: np.ndarray, plan: Tuple[np.ndarray, np.ndarray], keys: Tuple[ReductionKey, ...]) -> np.ndarray:
    """``keys`` of each segment of the flat float64 array ``wide`` (``plan``: the segments'
    starts and lengths), a ``[segments, len(keys)]`` array: one ``reduceat`` per kind of
    pass, whatever the number of segments. Definitions are those of :mod:`smdebug.reductions`;
    variances from the sums (as :func:`reduce_rows`), in two passes where that would cancel."""
    starts, n = plan
    needs_abs = any(is_abs or op == "l1" for op, is_abs in keys)
    magnitudes = np.abs(wide) if needs_abs else None
    cache: Dict[object, np.ndarray] = {}

    def total(is_abs):
        if ("sum", is_abs) not in cache:
            cache[("sum", is_abs)] = np.add.reduceat(magnitudes if is_abs else wide, starts)
        return cache[("sum", is_abs)]

    def sum_of_squares():  # the same for x and |x|
        if "sumsq" not in cache:
            cache["sumsq"] = np.add.reduceat(wide * wide, starts)
        return cache["sumsq"]

    def variance(is_abs):
        if ("var", is_abs) not in cache:
            mean = total(is_abs) / n
            var = sum_of_squares() / n - mean * mean
            for i in np.flatnonzero(~(var > CANCELLATION_LIMIT * mean * mean)):  # cancels, or not finite
                start, stop = int(starts[i]), int(starts[i] + n[i])
                centered = (magnitudes if is_abs else wide)[start:stop] - mean[i]
                var[i] = (centered * centered).sum() / n[i]  # not np.dot: OpenBLAS threads spin after it
            cache[("var", is_abs)] = var
        return cache[("var", is_abs)]

    lengths = n.astype(np.intp)
    health = lazy_health(keys, lambda columns: reference.health_partials(
        wide, columns, n, lambda a: np.add.reduceat(a, starts), lambda v: np.repeat(v, lengths), np,
        seg_count=lambda mask: np.add.reduceat(mask, starts, dtype=np.float64), host=True))
    out = np.empty((len(n), len(keys)), dtype=np.float64)
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as the reference
        for j, (op, is_abs) in enumerate(keys):
            src = magnitudes if is_abs else wide
            if op in HEALTH:
                out[:, j] = health(op, is_abs)
            elif op == "min":
                out[:, j] = np.minimum.reduceat(src, starts)
            elif op == "max":
                out[:, j] = np.maximum.reduceat(src, starts)
            elif op == "sum":
                out[:, j] = total(is_abs)
            elif op == "mean":
                out[:, j] = total(is_abs) / n
            elif op == "variance":
                out[:, j] = variance(is_abs)
            elif op == "std":
                out[:, j] = np.sqrt(variance(is_abs))
            elif op == "l1":
                out[:, j] = total(True)
            elif op == "l2":
                out[:, j] = np.sqrt(sum_of_squares())
            elif op == "prod":
                out[:, j] = np.multiply.reduceat(src, starts)
            elif op == "median":
                out[:, j] = [np.median(src[a:a + int(k)]) for a, k in zip(starts.tolist(), n.tolist())]
            else:
                raise ValueError(f"unknown reduction {op!r}")
    return out


def reduce_values(values: List[float], keys: Tuple[ReductionKey, ...]) -> np.ndarray:
    """``keys`` of one-element tensors given as their values (a step's losses and metrics), in
    plain Python: a handful of numpy and torch calls would cost the training thread far more
    than the arithmetic, their code being cold between steps (docs/performance.md). The same
    results as :func:`reduce_flat` on one-element segments: variance ``(v - v)**2`` (0, or
    NaN for an infinite or NaN value), ``l2`` as ``sqrt(v * v)``."""
    out = np.empty((len(values), len(keys)), dtype=np.float64)
    for i, value in enumerate(values):
        row = []
        for op, is_abs in keys:
            v = abs(value) if (is_abs or op == "l1") else value
            if op in HEALTH:
                row.append(_health_of_value(value, op))
            elif op in ("min", "max", "sum", "mean", "prod", "median", "l1"):
                row.append(v)
            elif op in ("variance", "std"):
                spread = v - v
                row.append(spread * spread)  # std of one value: sqrt(0) = 0, sqrt(NaN) = NaN
            elif op == "l2":
                row.append(math.sqrt(v * v))  # NaN stays NaN
            else:
                raise ValueError(f"unknown reduction {op!r}")
        out[i] = row
    return out


def _health_of_value(value: float, op: str) -> float:
    """A health reduction of a one-element tensor (the reference's on one value)."""
    finite = math.isfinite(value)
    if op == "nonfinite":
        return 0.0 if finite else 1.0
    if op == "zero_fraction":
        return 1.0 if value == 0 else 0.0
    if op == "kurtosis" or not finite:  # one value: no spread; or no finite element
        return math.nan
    kind, _, name = op.partition("flow_")
    largest, to_zero = reference.LOW_PRECISION_TYPES[name]
    if kind == "over":
        return 1.0 if abs(value) > largest else 0.0
    return math.nan if value == 0 else (1.0 if abs(value) <= to_zero else 0.0)


class BufferPool:
    """Stacking buffers kept from step to step (a step stacks the same groups each time).

    A fresh multi-megabyte tensor per group and step costs a page fault per 4 KiB page when
    it is first written (the allocator hands large blocks back to the system when freed): in
    a VM, more than the reduction itself (docs/performance.md). Bounded by ``max_bytes``;
    thread-safe (a batch may be finished on the worker while another is on the training
    thread: each takes its own buffer).
    """

    def __init__(self, max_bytes: int = 64 << 20):
        self._free: Dict[Tuple[torch.dtype, Tuple[int, ...]], List[torch.Tensor]] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def take(self, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
        with self._lock:
            kept = self._free.get((dtype, shape))
            if kept:
                buffer = kept.pop()
                self._bytes -= buffer.nbytes
                return buffer
        return torch.empty(shape, dtype=dtype)

    def give(self, buffer: torch.Tensor) -> None:
        with self._lock:
            if self._bytes + buffer.nbytes > self._max_bytes:
                self._free.clear()  # the groups changed: start over rather than keep stale ones
                self._bytes = 0
            self._free.setdefault((buffer.dtype, tuple(buffer.shape)), []).append(buffer)
            self._bytes += buffer.nbytes


def as_rows(stacked: torch.Tensor) -> torch.Tensor:
    """``[n, ...]`` as ``[n, size]``, real, in a dtype with fast CPU kernels (exact: integers and
    half floats widen losslessly)."""
    rows = stacked.reshape(stacked.shape[0], -1)
    if rows.is_complex():
        rows = rows.abs()
    if rows.dtype not in (torch.float32, torch.float64):
        rows = rows.to(torch.float64 if rows.dtype in FLOAT64_SOURCES else torch.float32)
    return rows


#: One-pass variances (E[x^2] - mean^2, float64) are kept where variance > this * mean^2,
#: i.e. where cancellation leaves a relative error well below 1e-9; other rows take two passes.
CANCELLATION_LIMIT = 1e-6


def reduce_rows(rows: torch.Tensor, keys: Tuple[ReductionKey, ...], buffers: Optional["BufferPool"] = None
                 ) -> np.ndarray:
    """``keys`` of every row of a ``[n, size]`` CPU tensor: a ``[n, len(keys)]`` float64 array.

    Runs on the step pipeline's worker, so every pass is a call that releases the GIL (the
    training thread runs Python meanwhile): torch's min/max and float64-accumulating sums and
    norms. numpy's casting reductions and einsum hold the GIL; they are avoided.
    Sums, means, norms and variances are accumulated in float64 (variance from the sums
    mean and l2 need anyway, or in two passes where that would cancel); min/max are exact
    in the tensor's own dtype. Definitions are those of :mod:`smdebug.reductions`. With
    ``buffers``, the scratch blocks (and the float64 copy the rare two-pass paths read) are
    buffers kept between steps.
    """
    if rows.numel() <= NUMPY_ROWS_MAX_NUMEL:  # each row a segment of one flat float64 copy
        return reduce_flat(rows.numpy().astype(np.float64).reshape(-1), row_segments(*rows.shape), keys)
    n = rows.shape[1]
    cache: Dict[object, object] = {}
    wide = None  # float64 copy of rows, made once for sums and norms (into a kept buffer)

    def get(key, compute):
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def source(is_abs: bool) -> torch.Tensor:
        if not is_abs:
            return rows
        return get("abs", rows.abs)

    def as_wide() -> torch.Tensor:
        nonlocal wide
        if wide is None:
            if rows.dtype == torch.float64:
                wide = rows
            elif buffers is not None:
                wide = buffers.take(torch.float64, tuple(rows.shape))
                wide.copy_(rows)
            else:
                wide = rows.to(torch.float64)
        return wide

    def extreme(op: str, is_abs: bool = False) -> torch.Tensor:  # "amin" or "amax" of each row
        return get((op, is_abs), lambda: getattr(source(is_abs), op)(dim=1))

    def wide_sums() -> Tuple[torch.Tensor, torch.Tensor]:
        """Each row's sum and sum of squares in float64; past :data:`WHOLE_WIDE_COPY_MAX`
        elements, block by block through a float64 scratch block that stays in cache
        (:func:`.row_health.scratch_blocks`) instead of a float64 copy of the rows.
        Not numpy's matmul of the rows with themselves for the squares, though faster alone:
        it runs on OpenBLAS, whose threads spin on every core after each call and slowed a
        training step of 24 tensors of 262k elements from 11 to 17 ms (docs/performance.md)."""
        def compute():
            if rows.dtype == torch.float64 or rows.numel() <= WHOLE_WIDE_COPY_MAX:
                wide_rows = as_wide()
                return wide_rows.sum(dim=1), torch.linalg.vector_norm(wide_rows, dim=1).square()
            sums = torch.zeros(rows.shape[0], dtype=torch.float64)
            squares = torch.zeros(rows.shape[0], dtype=torch.float64)
            for top, bottom, block, wide_block in scratch_blocks(rows, torch.float64, buffers):
                wide_block.copy_(block)
                sums[top:bottom] += wide_block.sum(dim=1)
                squares[top:bottom] += torch.linalg.vector_norm(wide_block, dim=1).square()
            return sums, squares
        return get("wide sums", compute)

    def total(is_abs: bool) -> torch.Tensor:
        if is_abs:
            return get(("sum", True), lambda: source(True).sum(dim=1, dtype=torch.float64))
        return wide_sums()[0]

    def sum_of_squares() -> torch.Tensor:
        return wide_sums()[1]

    def variance(is_abs: bool) -> torch.Tensor:
        def compute():
            mean = total(is_abs) / n
            if is_abs:  # |x| has no sum of squares at hand (rare): two passes
                return _two_pass_variance(source(True), mean)
            var = sum_of_squares() / n - mean * mean
            redo = ~(var > CANCELLATION_LIMIT * mean * mean)  # cancels, or not finite
            if bool(redo.any()):
                var[redo] = _two_pass_variance(rows[redo], mean[redo])
            return var
        return get(("var", is_abs), compute)

    def row_mean():  # float64, for the health moments
        return (total(False) / n).numpy()

    def row_extremes():  # float64 minima and maxima, for the health counts and moments
        return extreme("amin").numpy().astype(np.float64), extreme("amax").numpy().astype(np.float64)

    health = lazy_health(keys, lambda columns: health_of_rows(rows, as_wide, row_mean, row_extremes, buffers,
                                                               columns))
    out = np.empty((rows.shape[0], len(keys)), dtype=np.float64)
    with np.errstate(all="ignore"):
        for j, (op, is_abs) in enumerate(keys):
            if op in HEALTH:
                out[:, j] = health(op, is_abs)
            elif op == "min":
                out[:, j] = (extreme("amin", True) if is_abs else extreme("amin")).numpy()
            elif op == "max":
                out[:, j] = (extreme("amax", True) if is_abs else extreme("amax")).numpy()
            elif op == "sum":
                out[:, j] = total(is_abs).numpy()
            elif op == "mean":
                out[:, j] = (total(is_abs) / n).numpy()
            elif op == "variance":
                out[:, j] = variance(is_abs).numpy()
            elif op == "std":
                out[:, j] = variance(is_abs).sqrt().numpy()
            elif op == "l1":
                out[:, j] = total(True).numpy()
            elif op == "l2":
                out[:, j] = sum_of_squares().sqrt().numpy()
            elif op == "prod":
                out[:, j] = source(is_abs).to(torch.float64).prod(dim=1).numpy()
            elif op == "median":
                out[:, j] = np.median(source(is_abs).to(torch.float64).numpy(), axis=1)
            else:
                raise ValueError(f"unknown reduction {op!r}")
    if wide is not None and wide is not rows and buffers is not None:
        buffers.give(wide)
    return out


#: Groups of at most this many elements have their float64 sums taken of one float64 copy
#: (8 MiB at most); bigger ones, block by block (fewer calls for small groups, less memory
#: traffic for big ones).
WHOLE_WIDE_COPY_MAX = 1 << 20

#: Groups of at most this many elements are reduced in numpy, in float64 (:func:`reduce_flat`):
#: for small arrays a numpy call costs a microsecond, a torch call several.
NUMPY_ROWS_MAX_NUMEL = 1 << 16


def _two_pass_variance(rows: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    centered = rows.to(torch.float64) - mean[:, None]
    return centered.square_().sum(dim=1) / rows.shape[1]


#: Batches of at most this many elements in all (a step's biases, a small model's weights)
#: are reduced as segments of one flat float64 copy (:func:`reduce_segments`): a fixed
#: handful of numpy calls whatever the number of tensors and shapes.
SEGMENTS_MAX_NUMEL = 1 << 16


#: :func:`segment_plan`'s answer for a batch of a few one-element floating tensors.
ONE_VALUE_EACH = object()
#: ... at most this many (each is read with its own ``.item()``).
ONE_VALUE_MAX_TENSORS = 8


@functools.lru_cache(maxsize=256)
def segment_plan(dtypes: tuple, shapes: tuple):
    """Where each tensor starts in the flat copy and its length, for a batch that
    :func:`reduce_segments` can reduce (float32/float64 tensors of one dtype, none empty,
    at most :data:`SEGMENTS_MAX_NUMEL` elements); :data:`ONE_VALUE_EACH` for a few
    one-element floating tensors (:func:`reduce_values`); else None."""
    sizes = [math.prod(shape) for shape in shapes]
    if 0 < len(sizes) <= ONE_VALUE_MAX_TENSORS and all(size == 1 for size in sizes) \
            and all(dtype.is_floating_point for dtype in dtypes):
        return ONE_VALUE_EACH
    if not sizes or len(set(dtypes)) != 1 or dtypes[0] not in (torch.float32, torch.float64) or 0 in sizes \
            or sum(sizes) > SEGMENTS_MAX_NUMEL:
        return None
    return segments(np.array(sizes, np.int64))


def reduce_segments(tensors, plan: Tuple[np.ndarray, np.ndarray], keys: Tuple[ReductionKey, ...]) -> np.ndarray:
    """``keys`` of each of ``tensors`` (small CPU tensors, see :func:`segment_plan`): one flat
    float64 copy, reduced in segments (:func:`reduce_flat`)."""
    return reduce_flat(_flatten_dense_tensors(tensors).numpy().astype(np.float64), plan, keys)

"""Reductions of CPU tensors on the host, the strategies of the PyTorch backend's CPU path.

* :func:`reduce_rows`: every row of a ``[n, size]`` tensor (tensors of one dtype and shape
  stacked): torch's min/max and float64-accumulating sums and norms for large groups (calls
  that release the GIL), numpy for small ones (:func:`reduce_flat`);
* :func:`reduce_flat`: each segment of one flat float64 copy (a batch of small tensors);
* :func:`reduce_values`: one-element tensors given as their values, in plain Python.

Each strategy only produces the partial columns of :mod:`smdebug.reduction_columns`
(:func:`row_columns`; :func:`smdebug.reduction_columns.flat_columns` and ``value_columns`` for
the numpy ones), which its one finisher turns into reductions. The backend (backend.py)
decides which strategy reads a batch.
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors

from smdebug.reduction_columns import (CANCELLATION_LIMIT, HEALTH_COLUMNS, columns_for, finish, finish_table, flat_columns,
                                       needs_health, row_segments, segments, value_columns)

from .row_health import health_of_rows, scratch_blocks

ReductionKey = Tuple[str, bool]
#: Dtypes whose rows are reduced in float64 (widened losslessly); others in float32.
FLOAT64_SOURCES = frozenset({torch.float64, torch.int64, torch.int32, torch.complex128}
                            | {getattr(torch, n) for n in ("uint32", "uint64") if hasattr(torch, n)})


def reduce_flat(wide: np.ndarray, plan: Tuple[np.ndarray, np.ndarray], keys: Tuple[ReductionKey, ...]) -> np.ndarray:
    """``keys`` of each segment of the flat float64 array ``wide`` (``plan``: the segments'
    starts and lengths), a ``[segments, len(keys)]`` array (:func:`smdebug.reduction_columns.flat_columns`)."""
    return finish_table(flat_columns(wide, plan, columns_for(keys)), keys)


def reduce_values(values: List[float], keys: Tuple[ReductionKey, ...]) -> np.ndarray:
    """``keys`` of one-element tensors given as their values (a step's losses and metrics):
    :func:`smdebug.reduction_columns.value_columns` of each, no array call (a handful of numpy
    or torch calls would cost the training thread far more than the arithmetic, their code
    being cold between steps: docs/performance.md)."""
    needed = columns_for(keys)
    out = np.empty((len(values), len(keys)), dtype=np.float64)
    with np.errstate(all="ignore") if needs_health(needed) else _NOTHING:
        for i, value in enumerate(values):
            out[i] = finish(value_columns(value, needed), keys, math.sqrt)
    return out


_NOTHING = contextlib.nullcontext()


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


def reduce_rows(rows: torch.Tensor, keys: Tuple[ReductionKey, ...], buffers: Optional["BufferPool"] = None
                 ) -> np.ndarray:
    """``keys`` of every row of a ``[n, size]`` CPU tensor: a ``[n, len(keys)]`` float64 array
    (:func:`row_columns`, finished by :func:`smdebug.reduction_columns.finish_table`)."""
    return finish_table(row_columns(rows, columns_for(keys), buffers), keys)


def row_columns(rows: torch.Tensor, needed: Tuple[str, ...], buffers: Optional["BufferPool"] = None
                ) -> Dict[str, np.ndarray]:
    """The ``needed`` partial columns (:mod:`smdebug.reduction_columns`) of every row of a
    ``[n, size]`` CPU tensor, float64 numpy arrays (extremes in the rows' dtype).

    Runs on the step pipeline's worker, so every pass is a call that releases the GIL (the
    training thread runs Python meanwhile): torch's min/max and float64-accumulating sums and
    norms. numpy's casting reductions and einsum hold the GIL; they are avoided.
    Sums, norms and variances are accumulated in float64 (variance from the sums
    the mean and l2 need anyway, or in two passes where that would cancel); min/max are exact
    in the tensor's own dtype. With ``buffers``, the scratch blocks (and the float64 copy the
    rare two-pass paths read) are buffers kept between steps.
    """
    if rows.numel() <= NUMPY_ROWS_MAX_NUMEL:  # each row a segment of one flat float64 copy
        return flat_columns(rows.numpy().astype(np.float64).reshape(-1), row_segments(*rows.shape), needed)
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

    def variance(is_abs: bool) -> torch.Tensor:
        def compute():
            mean = total(is_abs) / n
            if is_abs:  # |x| has no sum of squares at hand (rare): two passes
                return _two_pass_variance(source(True), mean)
            var = wide_sums()[1] / n - mean * mean
            redo = ~(var > CANCELLATION_LIMIT * mean * mean)  # cancels, or not finite
            if bool(redo.any()):
                var[redo] = _two_pass_variance(rows[redo], mean[redo])
            return var
        return get(("var", is_abs), compute)

    def row_mean():  # float64, for the health moments
        return (total(False) / n).numpy()

    def row_extremes():  # float64 minima and maxima, for the health counts and moments
        return extreme("amin").numpy().astype(np.float64), extreme("amax").numpy().astype(np.float64)

    plain = {"sum": lambda: total(False), "sum_abs": lambda: total(True), "sum_sq": lambda: wide_sums()[1],
             "min": lambda: extreme("amin"), "max": lambda: extreme("amax"),
             "min_abs": lambda: extreme("amin", True), "max_abs": lambda: extreme("amax", True),
             "var": lambda: variance(False), "var_abs": lambda: variance(True),
             "prod": lambda: source(False).to(torch.float64).prod(dim=1),
             "prod_abs": lambda: source(True).to(torch.float64).prod(dim=1),
             "median": lambda: np.median(source(False).to(torch.float64).numpy(), axis=1),
             "median_abs": lambda: np.median(source(True).to(torch.float64).numpy(), axis=1)}
    out: Dict[str, np.ndarray] = {"count": np.full(rows.shape[0], float(n))}
    health = tuple(c for c in needed if c in HEALTH_COLUMNS and c != "count")
    with np.errstate(all="ignore"):
        for name in needed:
            if name in plain:
                value = plain[name]()
                out[name] = value.numpy() if isinstance(value, torch.Tensor) else value
        if health:
            out.update(health_of_rows(rows, as_wide, row_mean, row_extremes, buffers, health))
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

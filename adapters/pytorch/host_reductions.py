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
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors

from smdebug.reduction_columns import (CANCELLATION_LIMIT, columns_for, finish, finish_table, flat_columns, health_of,
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
    passes = RowPasses(rows, buffers)
    out: Dict[str, np.ndarray] = {"count": np.full(rows.shape[0], float(rows.shape[1]))}
    health = health_of(needed)
    try:
        with np.errstate(all="ignore"):
            for name in needed:
                if name in RowPasses.PLAIN:
                    value = RowPasses.PLAIN[name](passes)
                    out[name] = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if health:
                out.update(health_of_rows(passes, health))
    finally:
        passes.release()
    return out


class RowPasses:
    """The passes over a ``[n, size]`` CPU tensor's rows that its columns need, each made once
    (:func:`row_columns` asks for the plain columns, :func:`.row_health.health_of_rows` for
    the float64 copy, means and extremes its health counts and moments reuse)."""

    #: plain column -> how it is made of the passes
    PLAIN: Dict[str, Callable[["RowPasses"], object]] = {
        "sum": lambda p: p.total(False), "sum_abs": lambda p: p.total(True), "sum_sq": lambda p: p.wide_sums()[1],
        "min": lambda p: p.extreme("amin"), "max": lambda p: p.extreme("amax"),
        "min_abs": lambda p: p.extreme("amin", True), "max_abs": lambda p: p.extreme("amax", True),
        "var": lambda p: p.variance(False), "var_abs": lambda p: p.variance(True),
        "prod": lambda p: p.product(False), "prod_abs": lambda p: p.product(True),
        "median": lambda p: p.median(False), "median_abs": lambda p: p.median(True)}

    def __init__(self, rows: torch.Tensor, buffers: Optional["BufferPool"]):
        self.rows, self.buffers = rows, buffers
        self.size = rows.shape[1]
        self._made: Dict[object, object] = {}
        self._wide: Optional[torch.Tensor] = None  # float64 copy of rows, made once (into a kept buffer)

    def _once(self, key, compute):
        if key not in self._made:
            self._made[key] = compute()
        return self._made[key]

    def source(self, is_abs: bool) -> torch.Tensor:
        return self._once("abs", self.rows.abs) if is_abs else self.rows

    def wide(self) -> torch.Tensor:
        """The rows in float64 (themselves when they are)."""
        if self._wide is None:
            rows = self.rows
            if rows.dtype == torch.float64:
                self._wide = rows
            elif self.buffers is not None:
                self._wide = self.buffers.take(torch.float64, tuple(rows.shape))
                self._wide.copy_(rows)
            else:
                self._wide = rows.to(torch.float64)
        return self._wide

    def release(self) -> None:
        """Give the float64 copy back to the buffers it came from."""
        if self._wide is not None and self._wide is not self.rows and self.buffers is not None:
            self.buffers.give(self._wide)
        self._wide = None

    def extreme(self, op: str, is_abs: bool = False) -> torch.Tensor:  # "amin" or "amax" of each row
        return self._once((op, is_abs), lambda: getattr(self.source(is_abs), op)(dim=1))

    def wide_sums(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each row's sum and sum of squares in float64; past :data:`WHOLE_WIDE_COPY_MAX`
        elements, block by block through a float64 scratch block that stays in cache
        (:func:`.row_health.scratch_blocks`) instead of a float64 copy of the rows.
        Not numpy's matmul of the rows with themselves for the squares, though faster alone:
        it runs on OpenBLAS, whose threads spin on every core after each call and slowed a
        training step of 24 tensors of 262k elements from 11 to 17 ms (docs/performance.md)."""
        def compute():
            rows = self.rows
            if rows.dtype == torch.float64 or rows.numel() <= WHOLE_WIDE_COPY_MAX:
                wide_rows = self.wide()
                return wide_rows.sum(dim=1), torch.linalg.vector_norm(wide_rows, dim=1).square()
            sums = torch.zeros(rows.shape[0], dtype=torch.float64)
            squares = torch.zeros(rows.shape[0], dtype=torch.float64)
            for top, bottom, block, wide_block in scratch_blocks(rows, torch.float64, self.buffers):
                wide_block.copy_(block)
                sums[top:bottom] += wide_block.sum(dim=1)
                squares[top:bottom] += torch.linalg.vector_norm(wide_block, dim=1).square()
            return sums, squares
        return self._once("wide sums", compute)

    def total(self, is_abs: bool) -> torch.Tensor:
        if is_abs:
            return self._once(("sum", True), lambda: self.source(True).sum(dim=1, dtype=torch.float64))
        return self.wide_sums()[0]

    def variance(self, is_abs: bool) -> torch.Tensor:
        def compute():
            mean = self.total(is_abs) / self.size
            if is_abs:  # |x| has no sum of squares at hand (rare): two passes
                return _two_pass_variance(self.source(True), mean)
            var = self.wide_sums()[1] / self.size - mean * mean
            redo = ~(var > CANCELLATION_LIMIT * mean * mean)  # cancels, or not finite
            if bool(redo.any()):
                var[redo] = _two_pass_variance(self.rows[redo], mean[redo])
            return var
        return self._once(("var", is_abs), compute)

    def product(self, is_abs: bool) -> torch.Tensor:
        return self.source(is_abs).to(torch.float64).prod(dim=1)

    def median(self, is_abs: bool) -> np.ndarray:
        return np.median(self.source(is_abs).to(torch.float64).numpy(), axis=1)

    def mean(self) -> np.ndarray:  # float64, for the health moments
        return (self.total(False) / self.size).numpy()

    def extremes(self) -> Tuple[np.ndarray, np.ndarray]:  # float64 minima and maxima, for the health counts and moments
        return self.extreme("amin").numpy().astype(np.float64), self.extreme("amax").numpy().astype(np.float64)


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

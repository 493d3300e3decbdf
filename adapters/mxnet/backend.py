"""MXNet NDArrays as tensors for the core hook: snapshots and batched reductions.

At the end of a saved step the hook hands :meth:`MXNetBackend.materialize` every
NDArray the step recorded. Per context, it

* packs the tensors that need reductions into a few padded float64 matrices (one per
  power-of-two size class, so padding at most doubles the memory) and computes every
  requested reduction of every tensor with a fixed number of ``mx.nd`` ops per matrix;
* concatenates the raw tensors of each dtype into one flat array;
* copies each of those flat arrays to the host once (``asnumpy``) and slices it there.

So a saved step costs one host transfer per (context, dtype) of raw tensors plus one for
all reductions of a context, instead of one per tensor and reduction. Both paths only produce the partial columns of
:mod:`smdebug.reduction_columns`, finished by its one finisher: the results equal
:mod:`smdebug.reductions` (float64, population variance, flattened norms) within float32
tolerance; anything the device path does not cover (``median``, the health reductions) is
computed on the host from the same values (:func:`smdebug.reduction_columns.reduce_host`).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple, cast

import mxnet as mx
import numpy as np
from mxnet import autograd

from smdebug.capture.backend import Materialized, Request, TensorBackend
from smdebug.reduction_columns import columns_for, finish, reduce_host

#: Reductions computed on the device; others fall back to the host reference.
DEVICE_REDUCTIONS = frozenset({"min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2"})


def _as_nd(value) -> mx.nd.NDArray:
    """The legacy NDArray view of an ``mx.nd`` or ``mx.np`` array (no copy)."""
    if isinstance(value, mx.np.ndarray):
        return value.as_nd_ndarray()
    return value


class MXNetBackend(TensorBackend):
    """Tensor backend for ``mx.nd.NDArray`` (and ``mx.np.ndarray``) on any context."""

    name = "mxnet"

    def accepts(self, value) -> bool:
        return isinstance(value, mx.nd.NDArray)

    def snapshot(self, value, needs_copy: bool):
        """A device copy when the value is needed later (the optimizer updates in place)."""
        value = _as_nd(value)
        if not needs_copy or value.size == 0:  # an empty array has nothing to copy (and mx.nd cannot)
            return value
        # The engine orders this copy before any later in-place write to ``value``, so it
        # captures the value as of now without waiting; pause() keeps it out of the graph.
        with autograd.pause():
            return value.copy()

    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        results = [Materialized(raw=None, shape=tuple(req.value.shape) if req.shape else None) for req in requests]
        by_context: Dict[str, List[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            by_context[str(req.value.context)].append(i)
        with autograd.pause():
            for indices in by_context.values():
                self._materialize_context(requests, indices, results)
        return results

    # --- one context -------------------------------------------------------------------
    def _materialize_context(self, requests, indices, results) -> None:
        host_fallback = []  # (index, reductions) computed with numpy from the raw host value
        device_jobs = []  # (index, reductions) computed on the device
        raw_needed = []
        for i in indices:
            req = requests[i]
            value = req.value
            device_reds = tuple(r for r in req.reductions if r[0] in DEVICE_REDUCTIONS)
            other_reds = tuple(r for r in req.reductions if r[0] not in DEVICE_REDUCTIONS)
            if value.size == 0:
                device_reds = other_reds = ()  # the reference backend skips empty tensors too
            if device_reds:
                device_jobs.append((i, device_reds))
            if other_reds:
                host_fallback.append((i, other_reds))
            if req.raw or other_reds:
                raw_needed.append(i)

        reduced = _device_reductions([(requests[i].value, reds) for i, reds in device_jobs])
        for (i, _), values in zip(device_jobs, reduced):
            results[i].reductions.update(values)

        hosts = _to_host([requests[i].value for i in raw_needed])
        for i, host in zip(raw_needed, hosts):
            if requests[i].raw:
                results[i].raw = host
        for i, reds in host_fallback:
            host = hosts[raw_needed.index(i)]
            results[i].reductions.update(zip(reds, reduce_host(host, reds)))


def _to_host(values: Sequence[mx.nd.NDArray]) -> List[np.ndarray]:
    """Copy arrays of one context to numpy: one concatenation and one transfer per dtype."""
    out: List[Optional[np.ndarray]] = [None] * len(values)
    by_dtype: Dict[np.dtype, List[int]] = defaultdict(list)
    for i, value in enumerate(values):
        by_dtype[np.dtype(value.dtype)].append(i)
    for members in by_dtype.values():
        arrays = [values[i] for i in members]
        nonempty = [a.reshape(-1) for a in arrays if a.size]
        if len(nonempty) == 1:
            flat = nonempty[0].asnumpy()
        elif nonempty:
            flat = mx.nd.concat(*nonempty, dim=0).asnumpy()
        else:
            flat = np.empty(0, dtype=arrays[0].dtype)
        offset = 0
        for i, array in zip(members, arrays):
            out[i] = flat[offset:offset + array.size].reshape(array.shape)
            offset += array.size
    return cast(List[np.ndarray], out)  # each dtype's group filled its positions


def _size_class(n: int) -> int:
    return max(n - 1, 0).bit_length()


def _device_reductions(jobs: Sequence[Tuple[mx.nd.NDArray, Tuple[Tuple[str, bool], ...]]]
                       ) -> List[Dict[Tuple[str, bool], np.ndarray]]:
    """Every requested reduction of every (non-empty) array of one context, one transfer.

    Arrays of one dtype and power-of-two size class are stacked as rows of a zero-padded float64
    matrix with a validity mask; each reduction is then one or two row-wise ops for the
    whole matrix. All results are concatenated and copied to the host at once.
    """
    if not jobs:
        return []
    buckets: Dict[Tuple[int, np.dtype], List[int]] = defaultdict(list)
    for j, (value, _) in enumerate(jobs):
        buckets[(_size_class(value.size), np.dtype(value.dtype))].append(j)

    pieces = []  # device vectors, one per (bucket, reduction), concatenated for the transfer
    layout = []  # (job indices, reduction key, offset into the concatenation)
    offset = 0
    for members in buckets.values():
        wanted = list(dict.fromkeys(r for j in members for r in jobs[j][1]))
        for key, vector in _reduce_rows([jobs[j][0] for j in members], wanted):
            pieces.append(vector)
            layout.append((members, key, offset))
            offset += len(members)
    flat = (pieces[0] if len(pieces) == 1 else mx.nd.concat(*pieces, dim=0)).asnumpy()

    out: List[Dict[Tuple[str, bool], np.ndarray]] = [{} for _ in jobs]
    for members, key, start in layout:
        for row, j in enumerate(members):
            if key in jobs[j][1]:
                out[j][key] = np.asarray(flat[start + row], dtype=np.float64)
    # Keep each tensor's reductions in the order it asked for them.
    return [{key: result[key] for key in jobs[j][1]} for j, result in enumerate(out)]


def _reduce_rows(arrays: Sequence[mx.nd.NDArray], wanted: Sequence[Tuple[str, bool]]):
    """Yield ``((op, abs), float64 vector with one value per array)`` for each wanted reduction."""
    ctx = arrays[0].context
    dtype = np.dtype(arrays[0].dtype)
    if dtype.kind not in "iuf":  # e.g. bool: no zeros/concat of that type on every device
        arrays = [a.astype("float64") for a in arrays]
        dtype = np.dtype("float64")
    sizes = [int(a.size) for a in arrays]
    width = max(sizes)
    # One padding buffer; its slices are views, so packing costs a single concat op.
    padding = mx.nd.zeros((width - min(sizes),), ctx=ctx, dtype=dtype) if min(sizes) < width else None
    rows = []
    for array, size in zip(arrays, sizes):
        rows.append(array.reshape(-1))
        if size < width:
            assert padding is not None  # made since this row is shorter than the widest
            rows.append(padding[:width - size])
    packed = rows[0] if len(rows) == 1 else mx.nd.concat(*rows, dim=0)
    matrix = packed.reshape((len(arrays), width)).astype("float64", copy=False)
    counts = mx.nd.array(sizes, ctx=ctx, dtype="float64")
    mask = None
    if padding is not None:
        positions = mx.nd.arange(width, ctx=ctx, dtype="float64").reshape((1, width))
        mask = mx.nd.broadcast_lesser(positions, counts.reshape((-1, 1)))

    sources = {}

    def source(is_abs):
        if is_abs not in sources:
            sources[is_abs] = mx.nd.abs(matrix) if is_abs else matrix
        return sources[is_abs]

    def filled(x, value):
        """x with its padding replaced by ``value`` (so it cannot win a min/max/prod)."""
        if mask is None:
            return x
        return mx.nd.where(mask, x, mx.nd.full(x.shape, value, ctx=ctx, dtype="float64"))

    def has_nan():
        if "nan" not in sources:
            sources["nan"] = (matrix != matrix).sum(axis=1) > 0
        return sources["nan"]

    want = set(columns_for(tuple(wanted)))
    columns = {"count": counts}
    if "sum_sq" in want:
        columns["sum_sq"] = mx.nd.square(matrix).sum(axis=1)
    for a, is_abs in (("", False), ("_abs", True)):
        if not any(c.endswith("_abs") == is_abs for c in want if c not in ("count", "sum_sq")):
            continue
        x = source(is_abs)
        if "sum" + a in want or "var" + a in want:
            columns["sum" + a] = x.sum(axis=1)
        if "var" + a in want:
            centered = mx.nd.broadcast_sub(x, (columns["sum" + a] / counts).reshape((-1, 1)))
            if mask is not None:
                centered = centered * mask
            columns["var" + a] = mx.nd.square(centered).sum(axis=1) / counts
        for base, fill in (("min", np.inf), ("max", -np.inf)):
            if base + a in want:
                value = filled(x, fill).min(axis=1) if base == "min" else filled(x, fill).max(axis=1)
                # numpy propagates NaN through min/max; device kernels may skip it.
                columns[base + a] = mx.nd.where(has_nan(), mx.nd.full(value.shape, np.nan, ctx=ctx, dtype="float64"),
                                                value)
        if "prod" + a in want:
            columns["prod" + a] = filled(x, 1.0).prod(axis=1)
    yield from zip(wanted, finish(columns, wanted, mx.nd.sqrt))

"""TFBackend: the core's tensor contract for TensorFlow tensors and variables.

On a saved step the hook hands this backend every recorded tensor at once. All
reductions of the step run on the tensors' device inside one compiled ``tf.function``
(traced once per set of shapes, reused every saved step after that):

* the reducible tensors are flattened and concatenated, and every reduction kind
  (``min``, ``max``, ``sum``, ``prod``, ``mean``, ``variance``, ``std``, ``l1``, ``l2``
  and their ``abs_`` forms) is one segment op over all of them;
* ``median`` needs a sort and is computed per tensor, in the same function;
* the results come back as one ``[reduction kinds, tensors]`` matrix: one transfer.

Raw values: tensors on the CPU become numpy arrays without a copy (a snapshot is
immutable: a variable read is copy-on-write in TensorFlow); tensors on an accelerator are
concatenated per dtype on the device and copied to the host once per dtype.

Precision: 16/32-bit inputs are reduced in float32, 64-bit ones in float64 (the
reference, :mod:`smdebug.reductions`, uses float64). Definitions are the reference's:
population ``std``/``variance`` (two-pass), norms of the flattened tensor, complex
tensors reduced by magnitude, booleans and integers as numbers.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from smdebug.backend import Materialized, Request, TensorBackend

ReductionKey = Tuple[str, bool]

_FLOAT64_SOURCES = frozenset({tf.float64, tf.int64, tf.int32, tf.uint32, tf.uint64, tf.complex128})


def to_tensor(value):
    """A dense eager tensor for a tf.Tensor, tf.Variable, Keras variable or IndexedSlices."""
    if isinstance(value, tf.Variable):
        return value.read_value()
    inner = getattr(value, "value", None)
    if isinstance(inner, tf.Variable):  # keras.Variable on the TensorFlow backend
        return inner.read_value()
    if isinstance(value, tf.IndexedSlices):
        return tf.convert_to_tensor(value)
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value)
    return value


def is_tf_value(value) -> bool:
    """Whether ``value`` is something TFBackend handles (eager or not)."""
    if isinstance(value, (tf.Tensor, tf.Variable, tf.IndexedSlices, tf.SparseTensor)):
        return True
    return isinstance(getattr(value, "value", None), tf.Variable)


class TFBackend(TensorBackend):
    """Batched on-device reductions and host copies for TensorFlow values."""

    name = "tensorflow"

    def __init__(self):
        # One compiled reduction function per (input signature, reductions wanted).
        self._reducers: Dict[tuple, object] = {}

    def accepts(self, value) -> bool:
        return is_tf_value(value)

    def snapshot(self, value, needs_copy: bool):
        tensor = to_tensor(value)
        if not isinstance(tensor, tf.Tensor) or not hasattr(tensor, "numpy"):
            raise TypeError(f"smdebug can only save eager tensors, got a symbolic {type(tensor).__name__} "
                            "(inside tf.function, tensors reach the hook through its capture sites)")
        return tensor  # eager tensors are immutable; variable reads are copy-on-write

    # --- end of step ----------------------------------------------------------------
    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        results = [Materialized(raw=None, shape=tuple(int(d) for d in r.value.shape) if r.shape else None)
                   for r in requests]
        reducible = [i for i, r in enumerate(requests)
                     if r.reductions and _num_elements(r.value) > 0 and _is_numeric(r.value.dtype)]
        if reducible:
            self._reduce(requests, reducible, results)
        raw_indices = [i for i, r in enumerate(requests) if r.raw]
        for i, array in zip(raw_indices, self._to_host([requests[i].value for i in raw_indices])):
            results[i].raw = array
        return results

    def _reduce(self, requests, indices, results) -> None:
        keys: List[ReductionKey] = []
        for i in indices:
            keys += [k for k in requests[i].reductions if k not in keys]
        keys = tuple(keys)
        tensors = [requests[i].value for i in indices]
        compute = tf.float64 if any(t.dtype in _FLOAT64_SOURCES for t in tensors) else tf.float32
        signature = (tuple((tuple(t.shape), t.dtype) for t in tensors), keys, compute, tensors[0].device)
        reducer = self._reducers.get(signature)
        if reducer is None:
            if len(self._reducers) > 64:  # shapes keep changing (e.g. last batches): do not grow forever
                self._reducers.clear()
            sizes = [_num_elements(t) for t in tensors]
            reducer = self._reducers[signature] = _build_reducer(sizes, keys, compute)
        matrix = reducer(tensors).numpy()  # [len(keys), len(tensors)], the one transfer
        for column, i in enumerate(indices):
            wanted = requests[i].reductions
            results[i].reductions = {
                key: np.asarray(matrix[keys.index(key), column], dtype=np.float64) for key in wanted
            }

    @staticmethod
    def _to_host(tensors) -> List[np.ndarray]:
        if not tensors:
            return []
        on_host = all("CPU" in (t.device or "CPU").upper() for t in tensors)
        if on_host or len(tensors) == 1:
            return [t.numpy() for t in tensors]
        # Accelerator: one copy per dtype, split on the host (views of the fetched buffer).
        out: List[np.ndarray] = [None] * len(tensors)
        by_dtype: Dict[tf.DType, List[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        for dtype, idx in by_dtype.items():
            if dtype == tf.string:
                for i in idx:
                    out[i] = tensors[i].numpy()
                continue
            flat = tf.concat([tf.reshape(tensors[i], [-1]) for i in idx], axis=0).numpy()
            offset = 0
            for i in idx:
                shape = tuple(int(d) for d in tensors[i].shape)
                size = int(np.prod(shape, dtype=np.int64))
                out[i] = flat[offset:offset + size].reshape(shape)
                offset += size
        return out


def _is_numeric(dtype) -> bool:
    return dtype.is_floating or dtype.is_integer or dtype.is_complex or dtype == tf.bool


def _num_elements(t) -> int:
    return int(np.prod([int(d) for d in t.shape], dtype=np.int64))


def _as_real(t, compute):
    if t.dtype.is_complex:
        t = tf.abs(t)
    return tf.cast(t, compute)


def _build_reducer(sizes: List[int], keys: Tuple[ReductionKey, ...], compute):
    """A tf.function computing every (reduction, abs) of ``keys`` for each input tensor."""
    n = len(sizes)
    want_abs = any(a for _, a in keys)

    @tf.function(autograph=False)
    def reduce_all(tensors):
        flats = [tf.reshape(_as_real(t, compute), [-1]) for t in tensors]
        data = tf.concat(flats, axis=0) if n > 1 else flats[0]
        ids = tf.repeat(tf.range(n), sizes)
        counts = tf.constant(sizes, dtype=compute)
        columns: Dict[ReductionKey, tf.Tensor] = {}
        sources = [(False, data)] + ([(True, tf.abs(data))] if want_abs else [])
        for is_abs, x in sources:
            needed = {op for op, a in keys if a == is_abs}
            total = tf.math.segment_sum(x, ids) if needed & {"sum", "mean", "variance", "std"} else None
            if "min" in needed:
                columns[("min", is_abs)] = tf.math.segment_min(x, ids)
            if "max" in needed:
                columns[("max", is_abs)] = tf.math.segment_max(x, ids)
            if "sum" in needed:
                columns[("sum", is_abs)] = total
            if "prod" in needed:
                columns[("prod", is_abs)] = tf.math.segment_prod(x, ids)
            if needed & {"mean", "variance", "std"}:
                mean = total / counts
                columns[("mean", is_abs)] = mean
                if needed & {"variance", "std"}:
                    centered = x - tf.gather(mean, ids)
                    variance = tf.math.segment_sum(centered * centered, ids) / counts
                    columns[("variance", is_abs)] = variance
                    columns[("std", is_abs)] = tf.sqrt(variance)
            if "l1" in needed:
                columns[("l1", is_abs)] = tf.math.segment_sum(tf.abs(x), ids)
            if "l2" in needed:
                columns[("l2", is_abs)] = tf.sqrt(tf.math.segment_sum(x * x, ids))
            if "median" in needed:
                medians = []
                offset = 0
                for size in sizes:
                    part = tf.sort(x[offset:offset + size])
                    mid = size // 2
                    medians.append(part[mid] if size % 2 else (part[mid - 1] + part[mid]) / 2)
                    offset += size
                columns[("median", is_abs)] = tf.stack(medians)
        return tf.stack([columns[k] for k in keys], axis=0)

    return reduce_all

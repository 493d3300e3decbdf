"""TFBackend: the core's tensor contract for TensorFlow tensors and variables.

On a saved step the hook hands this backend every recorded tensor at once. All
reductions of the step run on the tensors' device inside one compiled ``tf.function``
(traced once per set of shapes, reused every saved step after that):

* small tensors are flattened and concatenated, and each reduction kind (``min``,
  ``max``, ``sum``, ``prod``, ``mean``, ``variance``, ``std``, ``l1``, ``l2`` and their
  ``abs_`` forms) is one segment op over all of them;
* big tensors (more than :data:`SEGMENT_MAX_NUMEL` elements) are reduced one by one with
  TensorFlow's vectorized reductions, in the same function;
* ``median`` needs a sort and is computed per tensor;
* the results come back as one ``[reduction kinds, tensors]`` matrix: one transfer.

Raw values: tensors on the CPU become numpy arrays without a copy (a snapshot is
immutable: a variable read is copy-on-write in TensorFlow); tensors on an accelerator are
concatenated per dtype on the device and copied to the host once per dtype.

Precision: 64-bit inputs are reduced in float64; 16/32-bit ones in float32 with
TensorFlow's tree reductions for big tensors and float64 accumulation for the small ones
reduced together (the reference, :mod:`smdebug.reductions`, is float64: results agree to
float32 rounding); min/max/median are exact. Definitions are the
reference's: population ``std``/``variance``, norms of the flattened tensor, complex
tensors reduced by magnitude, booleans and integers as numbers.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from smdebug.backend import Materialized, Request, TensorBackend

ReductionKey = Tuple[str, bool]

#: Tensors with at most this many elements are concatenated and reduced with segment ops;
#: bigger ones are reduced one by one (see _build_reducer).
SEGMENT_MAX_NUMEL = 8192
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


def read_variables(variables: Sequence[object], _cache: Dict[tuple, object] = {}) -> List[object]:
    """The current values of many variables, read with one call (eager tensors).

    Each read is a copy-on-write snapshot: a later update of a variable does not change it.
    """
    handles = [v if isinstance(v, tf.Variable) else v.value for v in variables]
    key = tuple(id(v) for v in handles)
    reader = _cache.get(key)
    if reader is None:
        if len(_cache) > 64:
            _cache.clear()
        # The function holds the variables, so their ids stay valid while it is cached.
        reader = _cache[key] = tf.function(lambda: [v.read_value() for v in handles],
                                           autograph=False).get_concrete_function()
    return reader()


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
            # A concrete function skips tf.function's per-call signature matching.
            reducer = self._reducers[signature] = _build_reducer(sizes, keys, compute).get_concrete_function(
                [tf.TensorSpec(t.shape, t.dtype) for t in tensors])
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
    return int(t.shape.num_elements())


def _as_real(t, compute):
    if t.dtype.is_complex:
        t = tf.abs(t)
    return tf.cast(t, compute)


def _build_reducer(sizes: List[int], keys: Tuple[ReductionKey, ...], compute):
    """A compiled function computing every (reduction, abs) of ``keys`` for each input tensor.

    It returns a ``[len(keys), len(sizes)]`` float64 matrix. Small tensors (biases, norms:
    often most of a model's tensors) are concatenated and reduced together with segment
    ops, a handful of ops whatever their number; big ones are reduced one by one with
    TensorFlow's vectorized, multithreaded reductions, which on a big tensor cost less than
    the single-threaded segment kernels.
    """
    small = [i for i, size in enumerate(sizes) if size <= SEGMENT_MAX_NUMEL]
    large = [i for i, size in enumerate(sizes) if size > SEGMENT_MAX_NUMEL]
    order = small + large
    inverse = np.argsort(order)

    @tf.function(autograph=False)
    def reduce_all(tensors):
        columns = []
        if small:
            columns.append(_segment_reductions([tensors[i] for i in small], [sizes[i] for i in small], keys,
                                               compute))
        for i in large:
            x = tf.reshape(_as_real(tensors[i], compute), [-1])
            columns.append(tf.reshape(_tensor_reductions(x, keys), [-1, 1]))
        matrix = tf.concat(columns, axis=1) if len(columns) > 1 else columns[0]
        return matrix if not large or not small else tf.gather(matrix, inverse, axis=1)

    return reduce_all


def _tensor_reductions(x, keys):
    """``keys`` of one flat tensor, stacked as float64 (Eigen's tree reductions keep float32
    sums within float32 rounding of the float64 reference)."""
    absolute = tf.abs(x)
    cache = {}

    def mean_of(values, is_abs):
        if ("mean", is_abs) not in cache:
            cache[("mean", is_abs)] = tf.reduce_mean(values)
        return cache[("mean", is_abs)]

    def variance_of(values, is_abs):
        if ("variance", is_abs) not in cache:
            cache[("variance", is_abs)] = tf.reduce_mean(tf.square(values - mean_of(values, is_abs)))
        return cache[("variance", is_abs)]

    out = []
    for op, is_abs in keys:
        values = absolute if is_abs else x
        if op == "min":
            out.append(tf.reduce_min(values))
        elif op == "max":
            out.append(tf.reduce_max(values))
        elif op == "sum":
            out.append(tf.reduce_sum(values))
        elif op == "prod":
            out.append(tf.reduce_prod(values))
        elif op == "mean":
            out.append(mean_of(values, is_abs))
        elif op == "variance":
            out.append(variance_of(values, is_abs))
        elif op == "std":
            out.append(tf.sqrt(variance_of(values, is_abs)))
        elif op == "l1":
            out.append(tf.reduce_sum(absolute))
        elif op == "l2":
            out.append(tf.sqrt(tf.reduce_sum(tf.square(x))))
        elif op == "median":
            out.append(_median(values))
        else:  # pragma: no cover - ReductionConfig validates names
            raise ValueError(f"unknown reduction {op!r}")
    return tf.stack([tf.cast(v, tf.float64) for v in out])


def _segment_reductions(tensors, sizes, keys, compute):
    """``[len(keys), len(tensors)]``: segment sums of x, x*x and |x| give sum, mean, variance
    (E[x^2] - E[x]^2, accumulated in float64), std, l1 and l2; segment min/max the extrema."""
    n = len(sizes)
    ops = {op for op, _ in keys}
    counts = np.asarray(sizes, dtype=np.float64)
    flats = [tf.reshape(_as_real(t, compute), [-1]) for t in tensors]
    data = tf.concat(flats, axis=0) if n > 1 else flats[0]
    ids = tf.repeat(tf.range(n), sizes)
    absolute = tf.abs(data)
    out: Dict[ReductionKey, tf.Tensor] = {}
    if ops & {"sum", "mean", "variance", "std", "l1", "l2"}:
        wide, wide_abs = tf.cast(data, tf.float64), tf.cast(absolute, tf.float64)
        total = tf.math.segment_sum(wide, ids)
        abs_total = tf.math.segment_sum(wide_abs, ids)
        squares = tf.math.segment_sum(wide * wide, ids)
        for is_abs, first in ((False, total), (True, abs_total)):
            mean = first / counts
            variance = tf.maximum(squares / counts - mean * mean, 0.0)
            out.update({("sum", is_abs): first, ("mean", is_abs): mean, ("variance", is_abs): variance,
                        ("std", is_abs): tf.sqrt(variance), ("l1", is_abs): abs_total,
                        ("l2", is_abs): tf.sqrt(squares)})
    for is_abs, x in ((False, data), (True, absolute)):
        needed = {op for op, a in keys if a == is_abs}
        if "min" in needed:
            out[("min", is_abs)] = tf.math.segment_min(x, ids)
        if "max" in needed:
            out[("max", is_abs)] = tf.math.segment_max(x, ids)
        if "prod" in needed:
            out[("prod", is_abs)] = tf.math.segment_prod(tf.cast(x, tf.float64), ids)
        if "median" in needed:
            out[("median", is_abs)] = tf.stack([_median(part) for part in tf.split(x, sizes)])
    return tf.stack([tf.cast(out[key], tf.float64) for key in keys], axis=0)


def _median(values):
    ordered = tf.sort(values)
    size = int(values.shape[0])
    mid = size // 2
    return tf.cast(ordered[mid] if size % 2 else (ordered[mid - 1] + ordered[mid]) / 2, tf.float64)

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
* both produce only the partial columns of :mod:`smdebug.reduction_columns` (sums, extremes,
  variances; for the health reductions, counts and moment sums in float64), which its one
  finisher turns into reductions, in the same function;
* the results come back as one ``[reduction kinds, tensors]`` matrix: one transfer.

Values the capture already reduced (:class:`ReducedValue`, see :meth:`.capture.GraphCapture.collect`)
pass through with their reductions as they are.

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

import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
import tensorflow as tf

from smdebug.capture.backend import Materialized, Request, TensorBackend
from smdebug.reduction_columns import Segments, columns_for, finish, health_of, health_partials

ReductionKey = Tuple[str, bool]
#: What :func:`smdebug.reduction_columns.health_partials` needs of an array library.
_TF_ARRAYS = types.SimpleNamespace(where=lambda mask, a, other: tf.where(mask, a, tf.constant(other, a.dtype)),
                                   isfinite=tf.math.is_finite)

#: Tensors with at most this many elements are concatenated and reduced with segment ops;
#: bigger ones are reduced one by one (see reduction_matrix).
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


def flat_caller(concrete):
    """A callable ``f(list of tensors)`` running a concrete function traced with one list
    argument (or none), without ``ConcreteFunction.__call__``'s binding of structured
    arguments, which costs ~15 us per tensor on a small CPU (more than most ops)."""
    call_flat = getattr(concrete, "_call_flat", None)  # private: fall back to the public call
    if call_flat is None or not hasattr(concrete, "captured_inputs"):  # pragma: no cover
        return lambda tensors: concrete(list(tensors)) if tensors else concrete()
    # captured_inputs is read at each call: a distributed variable resolves it per context.
    return lambda tensors: call_flat(list(tensors), concrete.captured_inputs)


def read_variables(variables: Sequence[Any], _cache: Dict[tuple, Callable] = {}) -> List[object]:
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
        reader = _cache[key] = flat_caller(tf.function(lambda: [v.read_value() for v in handles],
                                                       autograph=False).get_concrete_function())
    return reader(())


class ReducedValue:
    """A recorded tensor whose reductions were computed already (by the end-of-step call of
    :class:`.capture.GraphCapture`): ``reductions`` maps ``(op, abs)`` to a float64 value;
    ``tensor`` is the eager value when the step also needs it on the host, else None."""

    __slots__ = ("tensor", "shape", "reductions")

    def __init__(self, tensor, shape: Tuple[int, ...], reductions: Dict[ReductionKey, object]):
        self.tensor = tensor
        self.shape = shape
        self.reductions = reductions


def reducible(shape, dtype) -> bool:
    """Whether a tensor of this static shape (None: unknown) and dtype gets reductions."""
    return shape is not None and int(np.prod(shape, dtype=np.int64)) > 0 and _is_numeric(dtype)


def union_keys(key_lists) -> Tuple[ReductionKey, ...]:
    """The reduction keys of several requests, each once, in first-seen order."""
    keys: List[ReductionKey] = []
    for wanted in key_lists:
        keys += [k for k in wanted if k not in keys]
    return tuple(keys)


def compute_dtype(dtypes):
    """float64 when any input is 64-bit (or a 32-bit integer), else float32."""
    return tf.float64 if any(d in _FLOAT64_SOURCES for d in dtypes) else tf.float32


class TFBackend(TensorBackend):
    """Batched on-device reductions and host copies for TensorFlow values."""

    name = "tensorflow"

    def __init__(self):
        # One compiled reduction function per (input signature, reductions wanted).
        self._reducers: Dict[tuple, Callable] = {}

    def accepts(self, value) -> bool:
        return isinstance(value, ReducedValue) or is_tf_value(value)

    def snapshot(self, value, needs_copy: bool):
        if isinstance(value, ReducedValue):
            return value  # its tensor (if any) is an eager read: immutable
        tensor = to_tensor(value)
        if not isinstance(tensor, tf.Tensor) or not hasattr(tensor, "numpy"):
            raise TypeError(f"smdebug can only save eager tensors, got a symbolic {type(tensor).__name__} "
                            "(inside tf.function, tensors reach the hook through its capture sites)")
        return tensor  # eager tensors are immutable; variable reads are copy-on-write

    # --- end of step ----------------------------------------------------------------
    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        results, to_reduce, raw_indices, raw_tensors = [], [], [], []
        for i, r in enumerate(requests):
            value = r.value
            if isinstance(value, ReducedValue):
                have = value.reductions  # some or all of the plan's, in its order
                if len(have) != len(r.reductions):
                    have = {k: have[k] for k in r.reductions if k in have}
                results.append(Materialized(raw=None, shape=value.shape if r.shape else None,  # float64 scalars,
                                            reductions=cast(Dict[ReductionKey, np.ndarray], have)))  # as 0-d arrays
                value = value.tensor
            else:
                results.append(Materialized(raw=None, shape=tuple(int(d) for d in value.shape) if r.shape else None))
                if r.reductions and _num_elements(value) > 0 and _is_numeric(value.dtype):
                    to_reduce.append(i)
            if r.raw and value is not None:
                raw_indices.append(i)
                raw_tensors.append(value)
        if to_reduce:
            self._reduce(requests, to_reduce, results)
        for i, array in zip(raw_indices, self._to_host(raw_tensors)):
            results[i].raw = array
        return results

    def _reduce(self, requests, indices, results) -> None:
        keys = union_keys(requests[i].reductions for i in indices)
        tensors = [requests[i].value for i in indices]
        compute = compute_dtype(t.dtype for t in tensors)
        signature = (tuple((tuple(t.shape), t.dtype) for t in tensors), keys, compute, tensors[0].device)
        reducer = self._reducers.get(signature)
        if reducer is None:
            if len(self._reducers) > 64:  # shapes keep changing (e.g. last batches): do not grow forever
                self._reducers.clear()
            sizes = [_num_elements(t) for t in tensors]
            # A concrete function skips tf.function's per-call signature matching.
            traced = _build_reducer(sizes, keys, compute).get_concrete_function(
                [tf.TensorSpec(t.shape, t.dtype) for t in tensors])
            reducer = self._reducers[signature] = flat_caller(traced)
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
        out: List[Optional[np.ndarray]] = [None] * len(tensors)
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
        return cast(List[np.ndarray], out)  # each dtype's group filled its positions


def _is_numeric(dtype) -> bool:
    return dtype.is_floating or dtype.is_integer or dtype.is_complex or dtype == tf.bool


def _num_elements(t) -> int:
    return int(t.shape.num_elements())


def _as_real(t, compute):
    if t.dtype.is_complex:
        t = tf.abs(t)
    return tf.cast(t, compute)


def _build_reducer(sizes: List[int], keys: Tuple[ReductionKey, ...], compute):
    """A tf.function computing :func:`reduction_matrix` of its list of input tensors."""

    @tf.function(autograph=False)
    def reduce_all(tensors):
        return reduction_matrix(tensors, sizes, keys, compute)

    return reduce_all


def reduction_matrix(tensors, sizes: List[int], keys: Tuple[ReductionKey, ...], compute, xla: bool = False):
    """Graph ops computing every (reduction, abs) of ``keys`` for each of ``tensors`` (of
    ``sizes`` elements, all > 0): a ``[len(keys), len(tensors)]`` float64 matrix.
    ``xla``: the ops are compiled by XLA (which has no sorted segment kernels).

    Small tensors (biases, norms:
    often most of a model's tensors) are concatenated and reduced together with segment
    ops, a handful of ops whatever their number; big ones are reduced one by one with
    TensorFlow's vectorized, multithreaded reductions, which on a big tensor cost less than
    the single-threaded segment kernels.
    """
    small = [i for i, size in enumerate(sizes) if size <= SEGMENT_MAX_NUMEL]
    large = [i for i, size in enumerate(sizes) if size > SEGMENT_MAX_NUMEL]
    needed = columns_for(tuple(keys))
    matrices = []
    if small:
        matrices.append(_finished(_segment_columns([tensors[i] for i in small], [sizes[i] for i in small], needed,
                                                   compute, xla), keys))
    if large:
        matrices.append(_finished(_large_columns([tensors[i] for i in large], [sizes[i] for i in large], needed,
                                                 compute), keys))
    if len(matrices) == 1:
        return matrices[0]
    return tf.gather(tf.concat(matrices, axis=1), np.argsort(small + large), axis=1)


def _finished(columns, keys):
    """``[len(keys), tensors]`` float64 from the tensors' columns (the one finisher)."""
    return tf.stack([tf.cast(values, tf.float64) for values in finish(columns, keys, tf.sqrt)], axis=0)


def _large_columns(tensors, sizes, needed, compute):
    """The ``needed`` columns of big tensors, with as few passes over each as they allow: min,
    max, mean and two-pass variance of x and/or |x| (plus prod and median when asked); sums
    and the sum of squares follow from them in float64 (``n * mean``, ``n (var + mean^2)``:
    no cancellation). Every tensor's statistics are stacked and widened together, so the ops
    after the reductions do not grow with the number of tensors."""
    stats = []  # statistics reduced per tensor: (name, is_abs), a variance after its mean
    for name in needed:
        is_abs = name.endswith("_abs")
        base = name[:-4] if is_abs else name
        if base in ("min", "max", "prod", "median"):
            stats.append((base, is_abs))
        elif base in ("sum", "var", "sum_sq"):
            stats += [("mean", is_abs)] + ([("var", is_abs)] if base != "sum" else [])
    stats = sorted(dict.fromkeys(stats), key=lambda stat: stat[0] == "var")
    health = health_of(needed)
    per_tensor = []  # per tensor: {stat or health column: scalar}
    for t, size in zip(tensors, sizes):
        x = _as_real(t, compute)
        values = {False: x}
        if any(a for _, a in stats):
            values[True] = tf.abs(x)
        got = {}
        per_tensor.append(got)
        if health:
            partials = _health_partials(tf.reshape(_wide_exact(t), [1, -1]), health, [size],
                                        lambda a: tf.reduce_sum(tf.cast(a, tf.float64), axis=1), lambda v: v[:, None])
            got.update({c: partials[c][0] for c in health})
        for name, is_abs in stats:
            v = values[is_abs]
            if name == "min":
                got[(name, is_abs)] = _propagate_nan(tf.reduce_min(v), tf.reduce_any(tf.math.is_nan(v)))
            elif name == "max":
                got[(name, is_abs)] = _propagate_nan(tf.reduce_max(v), tf.reduce_any(tf.math.is_nan(v)))
            elif name == "mean":
                got[(name, is_abs)] = tf.reduce_mean(v)
            elif name == "var":
                got[(name, is_abs)] = tf.reduce_mean(tf.math.squared_difference(v, got[("mean", is_abs)]))
            elif name == "prod":
                got[(name, is_abs)] = tf.reduce_prod(v)
            else:
                # Exact in the compute dtype (an element or the mean of two): stacked with the rest.
                got[(name, is_abs)] = tf.cast(_median(tf.reshape(v, [-1])), compute)
    # one pack per statistic: the op count does not grow with the tensors.
    rows = {s: tf.stack([tf.cast(got[s], tf.float64) for got in per_tensor]) for s in list(stats) + list(health)}
    counts = np.asarray(sizes, dtype=np.float64)
    columns = {"count": counts}
    columns.update({c: rows[c] for c in health})
    for name, is_abs in stats:
        a = "_abs" if is_abs else ""
        if name in ("min", "max", "prod", "median"):
            columns[name + a] = rows[(name, is_abs)]
        elif name == "mean":
            columns["sum" + a] = rows[(name, is_abs)] * counts
        else:
            columns["var" + a] = rows[(name, is_abs)]
            if not is_abs:
                mean = rows[("mean", False)]
                columns["sum_sq"] = counts * (columns["var"] + mean * mean)
    return columns


def _segment_columns(tensors, sizes, needed, compute, xla=False):
    """The ``needed`` columns of small tensors concatenated: segment sums of x, x*x and |x| give
    the sums and variances (E[x^2] - E[x]^2, accumulated in float64); segment min/max the
    extrema. Under XLA the unsorted segment ops (same results) replace the sorted ones, which
    it lacks."""
    n = len(sizes)
    if xla:
        def unsorted(op):
            return lambda data, ids: op(data, ids, n)

        segment_sum, segment_min, segment_max, segment_prod = map(unsorted, (
            tf.math.unsorted_segment_sum, tf.math.unsorted_segment_min, tf.math.unsorted_segment_max,
            tf.math.unsorted_segment_prod))
    else:
        segment_sum, segment_min, segment_max, segment_prod = (
            tf.math.segment_sum, tf.math.segment_min, tf.math.segment_max, tf.math.segment_prod)
    counts = np.asarray(sizes, dtype=np.float64)
    flats = [tf.reshape(_as_real(t, compute), [-1]) for t in tensors]
    data = tf.concat(flats, axis=0) if n > 1 else flats[0]
    ids = tf.constant(np.repeat(np.arange(n, dtype=np.int32), sizes))  # not rebuilt at each call
    absolute = tf.abs(data)
    columns = {"count": counts}
    health = health_of(needed)
    if health:
        wide = [tf.reshape(_wide_exact(t), [-1]) for t in tensors]
        columns.update(_health_partials(tf.concat(wide, axis=0) if n > 1 else wide[0], health, sizes,
                                        lambda a: segment_sum(tf.cast(a, tf.float64), ids), lambda v: tf.gather(v, ids)))
    if {"sum", "sum_abs", "sum_sq", "var", "var_abs"} & set(needed):
        wide = tf.cast(data, tf.float64)
        total = segment_sum(wide, ids)
        abs_total = segment_sum(tf.abs(wide), ids)
        squares = segment_sum(wide * wide, ids)
        columns.update({"sum": total, "sum_abs": abs_total, "sum_sq": squares})
        for a, first in (("", total), ("_abs", abs_total)):
            mean = first / counts
            columns["var" + a] = tf.maximum(squares / counts - mean * mean, 0.0)
    for a, x in (("", data), ("_abs", absolute)):
        if "min" + a in needed or "max" + a in needed:
            has_nan = segment_max(tf.cast(tf.math.is_nan(x), tf.int32), ids) > 0
        if "min" + a in needed:
            columns["min" + a] = _propagate_nan(segment_min(x, ids), has_nan)
        if "max" + a in needed:
            columns["max" + a] = _propagate_nan(segment_max(x, ids), has_nan)
        if "prod" + a in needed:
            columns["prod" + a] = segment_prod(tf.cast(x, tf.float64), ids)
        if "median" + a in needed:
            columns["median" + a] = tf.stack([_median(part) for part in tf.split(x, sizes)])
    return columns


def _wide_exact(t):
    """``t`` as float64 (complex: magnitude), float32 subnormals kept. TensorFlow's CPU threads
    treat subnormal operands as zero (DAZ), so a plain cast would turn them into zeros and
    hide them from ``zero_fraction`` and ``underflow_*``: they are rebuilt from their bits
    (integer ops) instead. float64 subnormals (below 2.2e-308) still read as zero on CPU."""
    if t.dtype.is_complex:
        t = tf.abs(t)
    if not t.dtype.is_floating or t.dtype == tf.float64:
        return tf.cast(t, tf.float64)
    x = tf.cast(t, tf.float32)  # exact from float16 and bfloat16
    bits = tf.bitcast(x, tf.int32)
    magnitude = tf.bitwise.bitwise_and(bits, 0x7FFFFFFF)
    subnormal = (magnitude > 0) & (magnitude < 0x00800000)
    value = tf.cast(magnitude, tf.float64) * 2.0 ** -149  # the subnormal's value, exactly
    return tf.where(subnormal, tf.where(bits < 0, -value, value), tf.cast(x, tf.float64))


def _health_partials(x, columns, sizes, seg_sum, expand):
    """:func:`smdebug.reduction_columns.health_partials` of float64 ``x`` in TensorFlow ops."""
    counts = tf.constant(np.asarray(sizes, dtype=np.float64))
    return health_partials(x, columns, Segments(counts, seg_sum, expand, _TF_ARRAYS))


def _propagate_nan(extreme, has_nan):
    """TensorFlow's min/max skip NaN; numpy's (the reference, smdebug.reductions) return NaN
    for a tensor that holds one: a NaN is what a debugger must not hide."""
    return tf.where(has_nan, tf.constant(float("nan"), extreme.dtype), extreme)


def _median(values):
    """numpy's median: NaN when an element is NaN (``tf.sort`` places NaNs anywhere)."""
    ordered = tf.sort(values)
    size = int(values.shape[0])
    mid = size // 2
    middle = tf.cast(ordered[mid] if size % 2 else (ordered[mid - 1] + ordered[mid]) / 2, tf.float64)
    return _propagate_nan(middle, tf.reduce_any(tf.math.is_nan(values)))

"""Every reduction defined once, as partial columns: what it needs of a segment of elements,
how the columns of pieces of a tensor combine exactly, and the one finisher.

A *segment* is the elements one reduction value is taken of (a tensor, a row of stacked
tensors, a slice of a flat copy, a shard). Backends and their strategies (row stacks, flat and
device segments, single values, shards) only produce *columns*, one value per segment each,
in their own array library; :func:`finish` turns columns into reduction values, the same way
for all of them (numpy, torch, TensorFlow, MXNet arrays: it needs ``+ - * /`` and a ``sqrt``).

The columns (:data:`COLUMNS`), float64 where a library allows:

* ``count``: the segment's element count;
* ``sum``, ``sum_abs``, ``sum_sq``: sums of x, |x| and x**2 (the same for |x|);
* ``min``, ``max``, ``min_abs``, ``max_abs``: extremes (NaN when an element is NaN);
* ``var``, ``var_abs``: population variance of x and |x| (combined as the sums of squared
  deviations ``count * var``, Chan et al.'s pairwise update);
* ``prod``, ``prod_abs``, ``median``, ``median_abs``: no exact combination (:data:`UNCOMBINABLE`);
* the health columns (:data:`HEALTH_COLUMNS`): counts of finite, non-finite, zero and nonzero
  finite elements and of those past each low-precision limit; the finite elements' mean and
  sums of their 2nd-4th powers of deviation from it (``m2``-``m4``), of x and of |x|
  (``abs_``), combined by Pebay's pairwise update (:func:`combine`).

The reference definitions (numpy, one tensor at a time) are :mod:`smdebug.reductions`,
separate from these kernels; tests/contract checks every backend's columns against them.
Exact definitions: docs/format.md, section 8.3.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

ReductionKey = Tuple[str, bool]

#: Low-precision types of the ``overflow_<type>``/``underflow_<type>`` reductions, as
#: ``(largest finite value, largest magnitude that rounds to zero)``. Round to nearest even
#: sends a value of at most half the smallest subnormal to 0 (the tie goes to the even 0).
LOW_PRECISION_TYPES: Dict[str, Tuple[float, float]] = {
    name: (float(ml_dtypes.finfo(dtype).max), float(ml_dtypes.finfo(dtype).smallest_subnormal) / 2)
    for name, dtype in (("fp16", np.float16), ("bf16", ml_dtypes.bfloat16),
                        ("fp8_e4m3", ml_dtypes.float8_e4m3fn), ("fp8_e5m2", ml_dtypes.float8_e5m2))
}
HEALTH_REDUCTIONS: Tuple[str, ...] = ("nonfinite", "zero_fraction", "kurtosis") + tuple(
    f"{kind}_{name}" for kind in ("overflow", "underflow") for name in LOW_PRECISION_TYPES)

_MOMENTS = ("mean", "m2", "m3", "m4")
HEALTH_COLUMNS: Tuple[str, ...] = (
    ("count", "finite", "nonfinite", "zero", "nonzero")
    + tuple(f"over_{t}" for t in LOW_PRECISION_TYPES) + tuple(f"under_{t}" for t in LOW_PRECISION_TYPES)
    + _MOMENTS + tuple(f"abs_{m}" for m in _MOMENTS)
)
PLAIN_COLUMNS: Tuple[str, ...] = ("count", "sum", "sum_abs", "sum_sq", "min", "max", "min_abs", "max_abs",
                                  "var", "var_abs", "prod", "prod_abs", "median", "median_abs")
COLUMNS: Tuple[str, ...] = PLAIN_COLUMNS + HEALTH_COLUMNS[1:]
#: Columns of pieces that do not combine into the whole tensor's (:func:`combine` gives NaN).
UNCOMBINABLE = frozenset({"prod", "prod_abs", "median", "median_abs"})
_HEALTH_MOMENTS = frozenset(p + m for p in ("", "abs_") for m in _MOMENTS)


# --- the definitions: per reduction, the columns it needs and its formula ----------------------
# Each takes ``a`` ("_abs" for the abs_ form, else "") and gives ``(columns needed, formula)``;
# a formula takes the columns and the array library's ``sqrt``.
def _column(base: str):
    def define(a: str):
        name = base + a
        return (name,), lambda c, sqrt: c[name]
    return define


def _mean(a: str):
    total = "sum" + a
    return (total,), lambda c, sqrt: c[total] / c["count"]


def _std(a: str):
    var = "var" + a
    return (var,), lambda c, sqrt: sqrt(c[var])


def _l1(a: str):
    return ("sum_abs",), lambda c, sqrt: c["sum_abs"]


def _l2(a: str):
    return ("sum_sq",), lambda c, sqrt: sqrt(c["sum_sq"])


def _nonfinite(a: str):
    return ("finite", "nonfinite"), lambda c, sqrt: c["nonfinite"]


def _zero_fraction(a: str):
    return ("finite", "zero"), lambda c, sqrt: c["zero"] / c["count"]


def _kurtosis(a: str):
    """(m4 / n) / (m2 / n)^2 of the finite elements; NaN when none is finite or all are equal."""
    h = "abs_" if a else ""
    m2, m4 = h + "m2", h + "m4"
    return ("finite", h + "mean", m2, m4), lambda c, sqrt: c["finite"] * c[m4] / (c[m2] * c[m2])


def _overflow(low_precision_type: str):
    def define(a: str):
        over = "over_" + low_precision_type
        return ("finite", over), lambda c, sqrt: c[over] / c["finite"]
    return define


def _underflow(low_precision_type: str):
    def define(a: str):
        under = "under_" + low_precision_type
        return ("finite", "nonzero", under), lambda c, sqrt: c[under] / c["nonzero"]
    return define


_DEFINITIONS: Dict[str, Callable[[str], Tuple[Tuple[str, ...], Callable]]] = {
    "min": _column("min"), "max": _column("max"), "sum": _column("sum"), "prod": _column("prod"),
    "median": _column("median"), "mean": _mean, "variance": _column("var"), "std": _std, "l1": _l1, "l2": _l2,
    "nonfinite": _nonfinite, "zero_fraction": _zero_fraction, "kurtosis": _kurtosis,
}
for _type in LOW_PRECISION_TYPES:
    _DEFINITIONS["overflow_" + _type] = _overflow(_type)
    _DEFINITIONS["underflow_" + _type] = _underflow(_type)


@functools.lru_cache(maxsize=512)  # the same few key tuples at every saved step
def _defined(keys: Tuple[ReductionKey, ...]) -> tuple:
    out = []
    for op, is_abs in keys:
        define = _DEFINITIONS.get(op)
        if define is None:
            raise ValueError(f"unknown reduction {op!r}; allowed: {', '.join(_DEFINITIONS)}")
        out.append(define("_abs" if is_abs else ""))
    return tuple(out)


@functools.lru_cache(maxsize=512)
def columns_for(keys: Tuple[ReductionKey, ...], combinable: bool = False) -> Tuple[str, ...]:
    """The columns the reductions ``keys`` need, in :data:`COLUMNS` order (``count`` always).
    ``combinable``: also those that pieces of a tensor need to combine (the sums whose means
    the variances' combination needs; ``m3``, which the 4th moment sum of a union needs)."""
    need = {"count"}
    for (op, is_abs), (columns, _) in zip(keys, _defined(tuple(keys))):
        need.update(columns)
        if combinable and op in ("variance", "std"):
            need.add("sum_abs" if is_abs else "sum")
        if combinable and op == "kurtosis":
            need.add(("abs_" if is_abs else "") + "m3")
    return tuple(c for c in COLUMNS if c in need)


def finish(columns: Mapping[str, object], keys: Iterable[ReductionKey], sqrt: Callable = np.sqrt) -> List[Any]:
    """The one finisher: the reductions ``keys`` of every segment from their ``columns``
    (arrays of any library, one value per segment; ``sqrt`` of that library), one array per key.
    numpy callers silence its warnings (a NaN or an infinity in, one out; 0/0 where undefined)."""
    return [formula(columns, sqrt) for _, formula in _defined(tuple(keys))]


def finish_table(columns: Mapping[str, object], keys: Sequence[ReductionKey]) -> np.ndarray:
    """:func:`finish` of numpy columns as a ``[segments, len(keys)]`` float64 table."""
    segments = np.shape(columns["count"])[0] if np.ndim(columns["count"]) else 1
    out = np.empty((segments, len(keys)), dtype=np.float64)
    with np.errstate(all="ignore"):
        for j, values in enumerate(finish(columns, keys)):
            out[:, j] = values
    return out


# --- combination across pieces ---------------------------------------------------------------
def to_sums(columns: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Columns of pieces made ready to travel and :func:`combine`: variances as the sums of
    squared deviations (``dev2`` = ``count * var``, ``dev2_abs``), which add up."""
    out = {c: v for c, v in columns.items() if c not in ("var", "var_abs")}
    for a in ("", "_abs"):
        if "var" + a in columns:
            out["dev2" + a] = columns["var" + a] * columns["count"]
    return out


def to_variances(columns: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Combined columns (:func:`combine`) made ready to :func:`finish`: the variances from the
    sums of squared deviations (``var = dev2 / count``)."""
    out = {c: v for c, v in columns.items() if c not in ("dev2", "dev2_abs")}
    with np.errstate(all="ignore"):
        for a in ("", "_abs"):
            if "dev2" + a in columns:
                out["var" + a] = columns["dev2" + a] / columns["count"]
    return out


def combine(pieces: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The columns of whole tensors from those of their pieces, both in :func:`to_sums` form
    (:func:`to_variances` makes the result ready to finish): each ``pieces[c]`` is
    ``[pieces, tensors]``, each result ``[tensors]``. Exact in exact arithmetic: counts and sums add up, extremes take the
    extreme (propagating NaN); variances combine by Chan et al.'s pairwise update
    ``M2 = sum(M2_i + n_i (mean_i - mean)^2)``, the health moment sums by its extension
    (Pebay 2008; no cancellation of raw power sums). Pieces without elements (finite
    elements, for the moments) add nothing; a missing piece (NaN count) makes its tensor NaN."""
    if "var" in pieces or "var_abs" in pieces:
        raise ValueError("pieces combine in to_sums form (dev2, not var)")
    out: Dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        count_i = pieces["count"]
        count = out["count"] = count_i.sum(axis=0)
        for name, values in pieces.items():
            if name in ("min", "min_abs"):
                out[name] = values.min(axis=0)
            elif name in ("max", "max_abs"):
                out[name] = values.max(axis=0)
            elif name in UNCOMBINABLE:
                out[name] = np.full(values.shape[1:], np.nan)
            elif name not in _HEALTH_MOMENTS and not name.startswith("dev2"):
                out[name] = values.sum(axis=0)
        for a in ("", "_abs"):
            if "dev2" + a not in pieces:
                continue
            totals = pieces["sum" + a]
            mean = out["sum" + a] / count
            mean_i = np.where(count_i > 0, totals / np.where(count_i > 0, count_i, 1.0), 0.0)
            spread = np.where(count_i > 0, count_i * (mean_i - mean) ** 2, 0.0)
            out["dev2" + a] = (pieces["dev2" + a] + spread).sum(axis=0)
        for prefix in ("", "abs_"):
            if prefix + "mean" in pieces:
                out.update(_combine_moments(pieces, prefix))
    return out


def _combine_moments(pieces: Mapping[str, np.ndarray], prefix: str) -> Dict[str, np.ndarray]:
    """Pebay's pairwise update of the finite elements' mean and moment sums, piece by piece,
    every tensor at once."""
    shape = pieces["finite"].shape[1:]
    n, mean = np.zeros(shape), np.full(shape, np.nan)
    m2, m3, m4 = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for i in range(pieces["finite"].shape[0]):
        nb = pieces["finite"][i]
        own = tuple(pieces[prefix + m][i] if prefix + m in pieces else np.zeros(shape) for m in _MOMENTS)
        mb, m2b, m3b, m4b = own
        na, total = n, n + nb
        delta = mb - mean
        merged = (mean + delta * nb / total,
                  m2 + m2b + delta * delta * na * nb / total,
                  m3 + m3b + delta ** 3 * na * nb * (na - nb) / total ** 2 + 3 * delta * (na * m2b - nb * m2) / total,
                  m4 + m4b + delta ** 4 * na * nb * (na * na - na * nb + nb * nb) / total ** 3
                  + 6 * delta ** 2 * (na * na * m2b + nb * nb * m2) / total ** 2 + 4 * delta * (na * m3b - nb * m3) / total)
        skip, first = nb == 0, n == 0
        mean, m2, m3, m4 = (np.where(skip, old, np.where(first, mine, new))
                            for old, mine, new in zip((mean, m2, m3, m4), own, merged))
        n = np.where(skip, n, total)
    return {prefix + "mean": mean, prefix + "m2": m2, prefix + "m3": m3, prefix + "m4": m4}


# --- producers every library shares ----------------------------------------------------------
class Segments(NamedTuple):
    """How an array library reduces each segment of an array ``x`` (rows of a stacked batch,
    slices of a flat copy, one tensor): ``counts``, each segment's element count; ``sum(a)``,
    each segment's sum of a float64 array ``a`` (and of a boolean mask, unless ``count``
    counts those); ``expand(v)``, a per-segment value broadcast against ``x``; ``xp``, a
    namespace with ``where(mask, a, scalar)`` and ``isfinite`` (numpy and torch are ones)."""

    counts: Any
    sum: Callable
    expand: Callable
    xp: Any
    count: Optional[Callable] = None


def health_partials(x, columns: Sequence[str], segments: Segments, wide=None, host: bool = False,
                    peak: Optional[float] = None) -> Dict[str, Any]:
    """The health ``columns`` of each of the ``segments`` of ``x``, in any array library.

    Counts compare ``|x|`` with each bound (every bound is a float32 value: ``x`` may be
    float32). The moments are taken of ``wide`` (``x`` in float64; default ``x``), masked to
    the finite elements unless the peak (below) says there is nothing to mask.

    ``host``: ``x`` is a numpy array, whose extremes cost no transfer. Then the largest ``|x|``
    of all segments (``peak``, or an upper bound of it, when the caller has it; NaN if any
    element is NaN) settles most counts without a pass: when it is finite, so is every
    element, and no element exceeds a type whose largest value is at least that; no nonzero
    element is at most a bound below the smallest nonzero ``|x|``.
    """
    counts, seg_sum, expand, xp = segments.counts, segments.sum, segments.expand, segments.xp
    seg_count = segments.count or seg_sum
    kept: Dict[str, object] = {}  # |x| and the finite mask, made on first use

    def abs_x():
        if "abs" not in kept:
            kept["abs"] = abs(x)
        return kept["abs"]

    def is_finite():
        if "finite" not in kept:
            kept["finite"] = xp.isfinite(x)
        return kept["finite"]

    if host and peak is None:
        peak = float(abs_x().max())
    settled = host and math.isfinite(peak)
    out: Dict[str, object] = {"count": counts, "finite": counts if settled else seg_count(is_finite())}
    if "nonfinite" in columns:
        out["nonfinite"] = counts - out["finite"]
    for name, (largest, _) in LOW_PRECISION_TYPES.items():
        if f"over_{name}" in columns:  # "<=" leaves NaN and Inf out, as the finite count does
            out[f"over_{name}"] = counts * 0.0 if settled and peak <= largest else \
                out["finite"] - seg_count(abs_x() <= largest)
    under = [name for name in LOW_PRECISION_TYPES if f"under_{name}" in columns]
    if under or "zero" in columns or "nonzero" in columns:
        floor = float(abs_x().min()) if host else math.nan  # NaN: unknown
        if floor > 0:
            out["zero"] = zero = counts * 0.0
        else:
            is_zero = abs_x() <= 0.0  # -0.0 too
            out["zero"] = zero = seg_count(is_zero)
            if host and under:  # bounds below the smallest nonzero |x| have nothing past the zeros
                floor = smallest_nonzero(abs_x())
        out["nonzero"] = out["finite"] - zero
        for name in under:
            to_zero = LOW_PRECISION_TYPES[name][1]
            out[f"under_{name}"] = counts * 0.0 if to_zero < floor else seg_count(abs_x() <= to_zero) - zero
    if not ("mean" in columns or "abs_mean" in columns):
        return out
    wide = x if wide is None else wide
    masked = not settled
    for prefix in ("", "abs_"):
        if prefix + "mean" in columns:
            source = abs(wide) if prefix else wide
            if masked:
                mean = seg_sum(xp.where(is_finite(), source, 0.0)) / out["finite"]  # NaN where none is finite
                deviation = xp.where(is_finite(), source - expand(mean), 0.0)
            else:
                mean = seg_sum(source) / out["finite"]
                deviation = source - expand(mean)
            square = deviation * deviation
            out.update({prefix + "mean": mean, prefix + "m2": seg_sum(square), prefix + "m4": seg_sum(square * square)})
            if prefix + "m3" in columns:
                out[prefix + "m3"] = seg_sum(square * deviation)
    return out


def smallest_nonzero(magnitude: np.ndarray) -> float:
    """The smallest nonzero element of an array of magnitudes (``inf`` if none; NaNs left out), in
    two branch-free passes (``np.where`` on a mask of scattered zeros, such as ReLU outputs,
    is 50x slower): read as unsigned integers, nonnegative floats order as their values, and
    0 minus 1 wraps around to the largest."""
    unsigned = {4: np.uint32, 8: np.uint64}.get(magnitude.itemsize) if magnitude.dtype.kind == "f" else None
    if unsigned is None:
        positive = magnitude[magnitude > 0]
        return float(positive.min()) if positive.size else math.inf
    bits = np.ascontiguousarray(magnitude).reshape(-1).view(unsigned)
    below = (bits - unsigned(1)).min()
    if below == np.iinfo(unsigned).max:
        return math.inf
    smallest = float(np.array(below + unsigned(1), dtype=unsigned).view(magnitude.dtype))
    return math.inf if math.isnan(smallest) else smallest  # NaNs order above inf


#: One-pass variances (E[x^2] - mean^2, float64) are kept where variance > this * mean^2,
#: i.e. where cancellation leaves a relative error well below 1e-9; other segments take two passes.
CANCELLATION_LIMIT = 1e-6


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


def flat_columns(wide: np.ndarray, plan: Tuple[np.ndarray, np.ndarray], needed: Sequence[str]) -> Dict[str, np.ndarray]:
    """The ``needed`` columns of each segment of the flat float64 array ``wide`` (``plan``: the
    segments' starts and lengths, :func:`segments`): one ``reduceat`` per kind of pass, whatever
    the number of segments; variances from the sums, in two passes where that would cancel.
    (Straight-line code: closures calling one another would keep ``wide`` alive until the
    garbage collector runs, and fresh pages for every call cost more than the reductions.)"""
    starts, n = plan
    want = set(needed)
    got: Dict[str, np.ndarray] = {"count": n}
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as the reference
        health = health_of(needed)
        if health:
            lengths = n.astype(np.intp)
            segments = Segments(n, lambda a: np.add.reduceat(a, starts), lambda v: np.repeat(v, lengths), np,
                                count=lambda mask: np.add.reduceat(mask, starts, dtype=np.float64))
            got.update(health_partials(wide, health, segments, host=True))
        magnitudes = np.abs(wide) if any(c.endswith("_abs") for c in want) else None
        for a, src in (("", wide), ("_abs", magnitudes)):
            if src is None:
                continue
            if "min" + a in want:
                got["min" + a] = np.minimum.reduceat(src, starts)
            if "max" + a in want:
                got["max" + a] = np.maximum.reduceat(src, starts)
            if "sum" + a in want or "var" + a in want:
                got["sum" + a] = np.add.reduceat(src, starts)
            if "sum_sq" not in got and ("sum_sq" in want or "var" in want or "var_abs" in want):
                got["sum_sq"] = np.add.reduceat(wide * wide, starts)  # the same for x and |x|
            if "prod" + a in want:
                got["prod" + a] = np.multiply.reduceat(src, starts)
            if "median" + a in want:
                got["median" + a] = np.array([np.median(src[s:s + int(k)]) for s, k in zip(starts.tolist(), n.tolist())])
            if "var" + a in want:
                mean = got["sum" + a] / n
                var = got["sum_sq"] / n - mean * mean
                for i in np.flatnonzero(~(var > CANCELLATION_LIMIT * mean * mean)):  # cancels, or not finite
                    start, stop = int(starts[i]), int(starts[i] + n[i])
                    centered = src[start:stop] - mean[i]
                    var[i] = (centered * centered).sum() / n[i]  # not np.dot: OpenBLAS threads spin after it
                got["var" + a] = var
    return got


def _one_value_health(v: float, m: float) -> Dict[str, object]:
    """The health columns of one value; those that may divide (finite, nonzero, m2) as numpy
    float64 scalars, so that 0/0 is NaN."""
    finite = 1.0 if math.isfinite(v) else 0.0
    zero = 1.0 if v == 0 else 0.0
    nonzero = finite - zero
    out = {"finite": np.float64(finite), "nonfinite": 1.0 - finite, "zero": zero, "nonzero": np.float64(nonzero),
           "mean": v if finite else math.nan, "abs_mean": m if finite else math.nan,
           "m2": _NO_SPREAD, "abs_m2": _NO_SPREAD, "m3": 0.0, "abs_m3": 0.0, "m4": 0.0, "abs_m4": 0.0}
    for name, (largest, to_zero) in LOW_PRECISION_TYPES.items():
        out["over_" + name] = 1.0 if finite and m > largest else 0.0
        out["under_" + name] = 1.0 if nonzero and m <= to_zero else 0.0
    return out


_NO_SPREAD = np.float64(0.0)  # one value's sum of squared deviations


def value_columns(value: float, needed: Tuple[str, ...]) -> Dict[str, object]:
    """The ``needed`` columns of a one-element segment given as its value (a step's loss or
    metric), without an array call, whose cost would be the training thread's
    (docs/performance.md): the plain columns as Python floats (finish them with ``math.sqrt``),
    the health columns, whose fractions may be 0/0, as numpy float64 scalars (finish those
    under ``np.errstate(all="ignore")``)."""
    v = float(value)
    m = abs(v)
    spread = v - v  # 0, or NaN for an infinite or NaN value
    got = {"count": 1.0, "sum": v, "sum_abs": m, "sum_sq": v * v, "var": spread * spread,
           "var_abs": spread * spread, "min": v, "max": v, "prod": v, "median": v,
           "min_abs": m, "max_abs": m, "prod_abs": m, "median_abs": m}
    if needs_health(needed):
        got.update(_one_value_health(v, m))
    return got


def health_of(needed: Iterable[str]) -> Tuple[str, ...]:
    """The health columns among ``needed`` (``count`` aside: every strategy has it)."""
    return tuple(c for c in needed if c in HEALTH_COLUMNS and c != "count")


@functools.lru_cache(maxsize=512)
def needs_health(needed: Tuple[str, ...]) -> bool:
    """Whether any of the columns ``needed`` is a health column."""
    return bool(health_of(needed))


def reduce_host(array: np.ndarray, keys: Sequence[ReductionKey]) -> List[np.ndarray]:
    """Reductions of one non-empty host array (any real or complex dtype) through the columns
    (:func:`flat_columns`, one segment): each a 0-d float64 array."""
    array = np.asarray(array)
    wide = (np.abs(array) if np.iscomplexobj(array) else array).astype(np.float64).reshape(-1)
    keys = tuple(keys)
    table = finish_table(flat_columns(wide, segments(np.array([wide.size], np.int64)), columns_for(keys)), keys)
    return [np.asarray(value) for value in table[0]]

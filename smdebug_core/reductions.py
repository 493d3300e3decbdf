"""Reference definitions of every reduction, in numpy.

These are what the numpy backend computes and what the Trial computes when a reduction
was not saved. Framework backends compute the same quantities on their device and are
tested against these. Results are float64; ``std``/``variance`` are population statistics
(ddof 0) and norms are taken over the flattened tensor, whatever its rank.

This module is the one place reduction names are defined (:data:`REDUCTIONS`, :data:`NORMS`).
The *health* reductions (:data:`HEALTH_REDUCTIONS`: non-finite counts, zero fraction,
kurtosis, low-precision over- and underflow) are also computed by the backends from
per-tensor *partials* (counts and central moment sums, :func:`health_partials`), which add
up across shards (:func:`combine_health_partials`) and finish the same way everywhere
(:func:`finish_health`). Exact definitions: docs/format.md, section 8.3.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

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
#: Every reduction name (each also has an ``abs_`` form); ``median`` and the health
#: reductions are ours (smdebug 1.0.34 has none of them).
#: Reductions that are NaN where undefined (the kurtosis of equal values or of one element, a
#: fraction of no element), not because their tensor holds a NaN: the health reductions. Every
#: other reduction is NaN or infinite when its tensor holds a NaN or an infinity; of these,
#: ``nonfinite`` counts them instead.
NAN_WHEN_UNDEFINED = frozenset(HEALTH_REDUCTIONS)
REDUCTIONS: Tuple[str, ...] = ("min", "max", "median", "mean", "std", "variance", "sum", "prod") + HEALTH_REDUCTIONS
NORMS: Tuple[str, ...] = ("l1", "l2")
#: Names 1.0.34's reader rejects in a collections file's ``reductions`` string.
NOT_IN_ORIGINAL: Tuple[str, ...] = ("median",) + HEALTH_REDUCTIONS


def _finite(x: np.ndarray) -> np.ndarray:
    return x[np.isfinite(x)]


def _kurtosis(x: np.ndarray) -> float:
    finite = _finite(x)
    if finite.size == 0:
        return np.nan
    centered = finite - finite.mean()
    m2 = np.mean(centered ** 2)
    return np.mean(centered ** 4) / (m2 * m2)


def _overflow(limit: float) -> Callable[[np.ndarray], float]:
    def fraction(x: np.ndarray) -> float:
        finite = _finite(x)
        return np.count_nonzero(np.abs(finite) > limit) / finite.size if finite.size else np.nan
    return fraction


def _underflow(limit: float) -> Callable[[np.ndarray], float]:
    def fraction(x: np.ndarray) -> float:
        nonzero = _finite(x)
        nonzero = nonzero[nonzero != 0]
        return np.count_nonzero(np.abs(nonzero) <= limit) / nonzero.size if nonzero.size else np.nan
    return fraction

_OPS: Dict[str, Callable[[np.ndarray], float]] = {
    "min": np.min,
    "max": np.max,
    "median": np.median,
    "mean": np.mean,
    "std": np.std,
    "variance": np.var,
    "sum": np.sum,
    "prod": np.prod,
    "l1": lambda x: np.sum(np.abs(x)),
    "l2": lambda x: np.sqrt(np.sum(np.square(x))),
    "nonfinite": lambda x: np.count_nonzero(~np.isfinite(x)),
    "zero_fraction": lambda x: np.count_nonzero(x == 0) / x.size,
    "kurtosis": _kurtosis,
}
for _name, (_largest, _to_zero) in LOW_PRECISION_TYPES.items():
    _OPS[f"overflow_{_name}"] = _overflow(_largest)
    _OPS[f"underflow_{_name}"] = _underflow(_to_zero)


def as_float_array(array: np.ndarray) -> np.ndarray:
    """The tensor as float64 (complex: its magnitude), the domain every reduction uses."""
    array = np.asarray(array)
    if np.iscomplexobj(array):
        return np.abs(array).astype(np.float64)
    return array.astype(np.float64, copy=False)


def reduce(array: np.ndarray, reduction: str, is_abs: bool = False) -> np.ndarray:
    """One reduction of ``array`` as a 0-d float64 array.

    Raises ValueError for an unknown reduction or an empty tensor.
    """
    op = _OPS.get(reduction)
    if op is None:
        raise ValueError(f"unknown reduction {reduction!r}; allowed: {', '.join(_OPS)}")
    x = as_float_array(array)
    if x.size == 0:
        raise ValueError("cannot reduce an empty tensor")
    if is_abs:
        x = np.abs(x)
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out: saved faithfully
        return np.asarray(op(x), dtype=np.float64)


def reduce_many(array: np.ndarray, specs: Iterable[Tuple[str, bool]]) -> List[np.ndarray]:
    """Several reductions of one tensor, converting it to float64 once."""
    x = as_float_array(array)
    if x.size == 0:
        raise ValueError("cannot reduce an empty tensor")
    ax = None
    out = []
    with np.errstate(all="ignore"):
        for name, is_abs in specs:
            src = x
            if is_abs:
                ax = np.abs(x) if ax is None else ax
                src = ax
            out.append(np.asarray(_OPS[name](src), dtype=np.float64))
    return out


# --- health reductions from partials ----------------------------------------------------------
#: Per-tensor partials of the health reductions, float64 each: counts of all, finite,
#: non-finite, zero and nonzero finite elements and of those past each low-precision limit;
#: the finite elements' mean and sums of their 2nd-4th powers of deviation from it
#: (``m2``-``m4``), of x and of |x| (``abs_``). All add up across the pieces of a tensor.
_MOMENTS = ("mean", "m2", "m3", "m4")
HEALTH_COLUMNS: Tuple[str, ...] = (
    ("count", "finite", "nonfinite", "zero", "nonzero")
    + tuple(f"over_{t}" for t in LOW_PRECISION_TYPES) + tuple(f"under_{t}" for t in LOW_PRECISION_TYPES)
    + _MOMENTS + tuple(f"abs_{m}" for m in _MOMENTS)
)


@functools.lru_cache(maxsize=256)  # the same few key tuples at every saved step
def health_columns(keys: Tuple[Tuple[str, bool], ...], combinable: bool = False) -> Tuple[str, ...]:
    """The partial columns the health reductions among ``keys`` need (empty when none).
    ``combinable``: also those that pieces of a tensor need to combine (``m3``: the 4th
    moment sum of a union needs the 3rd of its parts; one tensor's kurtosis does not)."""
    need = set()
    moments = _MOMENTS if combinable else ("mean", "m2", "m4")
    for op, is_abs in keys:
        if op == "nonfinite":
            need.add("nonfinite")
        elif op == "zero_fraction":
            need.add("zero")
        elif op == "kurtosis":
            need.update(("abs_" if is_abs else "") + m for m in moments)
        elif op.startswith("overflow_"):
            need.add("over_" + op[len("overflow_"):])
        elif op.startswith("underflow_"):
            need.update(("nonzero", "under_" + op[len("underflow_"):]))
    if need:
        need.update(("count", "finite"))
    return tuple(c for c in HEALTH_COLUMNS if c in need)


def health_partials(x, columns: Sequence[str], counts, seg_sum: Callable, expand: Callable, xp,
                    seg_count: Optional[Callable] = None, wide=None, host: bool = False, peak: Optional[float] = None) -> Dict[str, object]:
    """The ``columns`` of each segment of ``x``, in any array library.

    ``counts``: each segment's element count; ``seg_sum(a)``: each segment's sum of a float64
    array ``a`` (and of a boolean mask, unless ``seg_count`` counts those); ``expand(v)``: a
    per-segment value broadcast against ``x``; ``xp``: a namespace with ``where(mask, a,
    scalar)`` and ``isfinite`` (numpy and torch are ones). Counts compare ``|x|`` with each
    bound (every bound is a float32 value: ``x`` may be float32). The moments are taken of
    ``wide`` (``x`` in float64; default ``x``), masked to the finite elements unless the peak
    (below) says there is nothing to mask. Backends call it with their own segments: rows of
    a stacked batch, slices of a flat copy, one tensor.

    ``host``: ``x`` is a numpy array, whose extremes cost no transfer. Then the largest ``|x|``
    of all segments (``peak``, or an upper bound of it, when the caller has it; NaN if any
    element is NaN) settles most counts without a pass: when it is finite, so is every
    element, and no element exceeds a type whose largest value is at least that; no nonzero
    element is at most a bound below the smallest nonzero ``|x|``.
    """
    seg_count = seg_count or seg_sum
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


def finish_health(partials: Dict[str, object], op: str, is_abs: bool):
    """A health reduction from its partials (arrays of any library, one value per segment)."""
    if op == "nonfinite":
        return partials["nonfinite"]
    if op == "zero_fraction":
        return partials["zero"] / partials["count"]
    if op == "kurtosis":  # (m4 / n) / (m2 / n)^2; NaN when no element is finite or all are equal
        prefix = "abs_" if is_abs else ""
        m2 = partials[prefix + "m2"]
        return partials["finite"] * partials[prefix + "m4"] / (m2 * m2)
    if op.startswith("overflow_"):
        return partials["over_" + op[len("overflow_"):]] / partials["finite"]
    if op.startswith("underflow_"):
        return partials["under_" + op[len("underflow_"):]] / partials["nonzero"]
    raise ValueError(f"{op!r} is not a health reduction; those are: {', '.join(HEALTH_REDUCTIONS)}")


def combine_health_partials(rows: np.ndarray, columns: Sequence[str]) -> np.ndarray:
    """The partials of a whole tensor from those of its pieces (``rows``: one per piece, in
    ``columns``' order): counts add up; means and moment sums combine pairwise (Pebay 2008,
    exact in exact arithmetic, no cancellation of raw power sums). Pieces without finite
    elements add nothing to the moments."""
    col = {c: i for i, c in enumerate(columns)}
    out = np.zeros(len(columns))
    for c in columns:
        if c not in _MOMENTS and not c.startswith("abs_"):
            out[col[c]] = rows[:, col[c]].sum()
    for prefix in ("", "abs_"):
        if prefix + "mean" not in col:
            continue
        n, mean, m2, m3, m4 = 0.0, np.nan, 0.0, 0.0, 0.0
        for row in rows:
            nb = row[col["finite"]]
            if nb == 0:
                continue
            mb, m2b, m3b, m4b = (row[col[prefix + m]] for m in _MOMENTS)
            if n == 0:
                n, mean, m2, m3, m4 = nb, mb, m2b, m3b, m4b
                continue
            na, total = n, n + nb
            delta = mb - mean
            m4 = (m4 + m4b + delta ** 4 * na * nb * (na * na - na * nb + nb * nb) / total ** 3
                  + 6 * delta ** 2 * (na * na * m2b + nb * nb * m2) / total ** 2 + 4 * delta * (na * m3b - nb * m3) / total)
            m3 = m3 + m3b + delta ** 3 * na * nb * (na - nb) / total ** 2 + 3 * delta * (na * m2b - nb * m2) / total
            m2 = m2 + m2b + delta * delta * na * nb / total
            mean = mean + delta * nb / total
            n = total
        out[[col[prefix + m] for m in _MOMENTS]] = (mean, m2, m3, m4)
    return out

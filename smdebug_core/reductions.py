"""Reference definitions of every reduction, in numpy.

These are what the Trial computes when a reduction was not saved, and what every backend's
results are tested against (tests/contract). Results are float64; ``std``/``variance`` are population statistics
(ddof 0) and norms are taken over the flattened tensor, whatever its rank.

This module names the reductions (:data:`REDUCTIONS`, :data:`NORMS`; the health ones,
:data:`HEALTH_REDUCTIONS`, with the partial columns they come from). Backends never call these
definitions: they produce the partial columns of :mod:`smdebug.reduction_columns` (counts,
sums, extremes, moment sums), which combine exactly across pieces and finish with its one
finisher; tests/contract checks them against this module. The health partials' names below
(:func:`health_partials`, :func:`health_columns`, :func:`finish_health`,
:func:`combine_health_partials`) are those of :mod:`smdebug.reduction_columns`.
Exact definitions: docs/format.md, section 8.3.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import numpy as np

from .reduction_columns import (HEALTH_COLUMNS, HEALTH_REDUCTIONS, LOW_PRECISION_TYPES, columns_for,  # noqa: F401
                                combine, finish, health_partials, smallest_nonzero)

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


# --- the health partials, by their names in this module ------------------------------------
def health_columns(keys: Tuple[Tuple[str, bool], ...], combinable: bool = False) -> Tuple[str, ...]:
    """The health columns the health reductions among ``keys`` need (empty when none):
    :func:`smdebug.reduction_columns.columns_for` of those."""
    health = tuple(k for k in keys if k[0] in NAN_WHEN_UNDEFINED)
    return tuple(c for c in columns_for(health, combinable) if c in HEALTH_COLUMNS) if health else ()


def finish_health(partials: Dict[str, object], op: str, is_abs: bool):
    """A health reduction from its partials: :func:`smdebug.reduction_columns.finish`."""
    if op not in NAN_WHEN_UNDEFINED:
        raise ValueError(f"{op!r} is not a health reduction; those are: {', '.join(HEALTH_REDUCTIONS)}")
    return finish(partials, ((op, is_abs),))[0]


def combine_health_partials(rows: np.ndarray, columns: Sequence[str]) -> np.ndarray:
    """The partials of a whole tensor from those of its pieces (``rows``: one per piece, in
    ``columns``' order): :func:`smdebug.reduction_columns.combine`."""
    whole = combine({c: rows[:, j, None] for j, c in enumerate(columns)})
    return np.array([whole[c][0] for c in columns])

"""Reference definitions of every reduction, in numpy.

These are what the numpy backend computes and what the Trial computes when a reduction
was not saved. Framework backends compute the same quantities on their device and are
tested against these. Results are float64; ``std``/``variance`` are population statistics
(ddof 0) and norms are taken over the flattened tensor, whatever its rank.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Tuple

import numpy as np

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
}


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

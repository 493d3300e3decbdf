"""Reference definitions of every reduction, in numpy.

These are what the numpy backend computes and what the Trial computes when a reduction
was not saved. Framework backends compute the same quantities on their device and are
tested against these. Results are float64; ``std``/``variance`` are population statistics
(ddof 0) and norms are taken over the flattened tensor, whatever its rank.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence, Tuple

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


def reduce_segments(flat: np.ndarray, sizes: Sequence[int], specs: Iterable[Tuple[str, bool]]) -> np.ndarray:
    """Reductions of many tensors at once: ``flat`` is their float64 values end to end,
    ``sizes`` their (non-zero) element counts; returns a ``[len(specs), len(sizes)]``
    float64 array. A few numpy calls (``ufunc.reduceat``) whatever the number of tensors,
    where :func:`reduce_many` per tensor pays several calls for each.
    ``median`` is not supported here (it needs a sort per tensor).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    cache: Dict[object, np.ndarray] = {}

    def source(is_abs):
        if not is_abs:
            return flat
        if "abs" not in cache:
            cache["abs"] = np.abs(flat)
        return cache["abs"]

    def total(is_abs):
        if ("sum", is_abs) not in cache:
            cache[("sum", is_abs)] = np.add.reduceat(source(is_abs), starts)
        return cache[("sum", is_abs)]

    def variance(is_abs):
        if ("variance", is_abs) not in cache:  # two passes, as np.var: exact for large means
            src = source(is_abs)
            centered = src - np.repeat(total(is_abs) / sizes, sizes)
            cache[("variance", is_abs)] = np.add.reduceat(np.square(centered, out=centered), starts) / sizes
        return cache[("variance", is_abs)]

    rows = []
    with np.errstate(all="ignore"):  # NaN/Inf in, NaN/Inf out, as reduce()
        for name, is_abs in specs:
            if name == "min":
                rows.append(np.minimum.reduceat(source(is_abs), starts))
            elif name == "max":
                rows.append(np.maximum.reduceat(source(is_abs), starts))
            elif name == "sum":
                rows.append(total(is_abs))
            elif name == "prod":
                rows.append(np.multiply.reduceat(source(is_abs), starts))
            elif name == "mean":
                rows.append(total(is_abs) / sizes)
            elif name == "variance":
                rows.append(variance(is_abs))
            elif name == "std":
                rows.append(np.sqrt(variance(is_abs)))
            elif name == "l1":
                rows.append(total(True))
            elif name == "l2":
                rows.append(np.sqrt(np.add.reduceat(np.square(flat), starts)))
            else:
                raise ValueError(f"reduce_segments cannot compute {name!r}; allowed: "
                                 f"{', '.join(op for op in _OPS if op != 'median')}")
    return np.stack(rows) if rows else np.zeros((0, len(sizes)))

"""Health reductions of groups of CPU rows (``[n, size]``, the step worker's stacked tensors):
their partial columns (:func:`smdebug.reduction_columns.health_partials`) computed block by block, in the
rows' own dtype, most counts settled by the rows' extremes, and the kurtosis moments of float32
rows in float32. :func:`.host_reductions.reduce_rows` calls :func:`health_of_rows` with what its
plain reductions already have (means, minima and maxima, a float64 copy for the rare paths).
Costs and the reasons behind them: docs/performance.md, "Training health".
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from smdebug.reduction_columns import Segments, health_partials

MOMENT_COLUMNS = frozenset(p + m for p in ("", "abs_") for m in ("mean", "m2", "m3", "m4"))


def health_of_rows(passes, columns: Tuple[str, ...]):
    """Health partials of each row of a big ``[n, size]`` CPU tensor (``passes``: its
    :class:`.host_reductions.RowPasses`). Counts with numpy, block by block (:func:`row_blocks`),
    in the rows' own dtype, most of them settled by the rows' extremes (``passes.extremes()``,
    float64; see :func:`smdebug.reduction_columns.health_partials`); moments of float32 rows in
    float32 (:func:`float32_moments`, from ``passes.mean()``), else (or where some element is
    not finite) of the float64 copy the sums use (``passes.wide()``)."""
    rows = passes.rows
    x = rows.detach().numpy()
    n_rows, size = x.shape

    def partials(block, wanted, wide=None):
        width = block.shape[1]
        segments = Segments(np.full(block.shape[0], float(width)), lambda a: a.sum(axis=1), lambda v: v[:, None], np,
                            count=count_per_row)
        return health_partials(block, wanted, segments, wide=wide, host=True, peak=peak)

    low, high = passes.extremes()
    peak = float(np.max([-low.min(), high.max()]))  # NaN if any element is; of every block, an upper bound
    out: Dict[str, np.ndarray] = {}
    for top, bottom, left, right in row_blocks(n_rows, size):  # every count adds up over a row's blocks
        for name, counts in partials(x[top:bottom, left:right], tuple(c for c in columns if c not in MOMENT_COLUMNS)
                                     ).items():
            out.setdefault(name, np.zeros(n_rows))[top:bottom] += counts
    moments = [c for c in columns if c in MOMENT_COLUMNS]
    if not moments:
        return out
    fast = None
    if rows.dtype == torch.float32 and bool((out["finite"] == size).all()) and "abs_mean" not in moments \
            and "m3" not in moments:
        fast = float32_moments(rows.detach(), passes.mean(), low, high, passes.buffers)
    out.update(fast if fast is not None else partials(x, columns, passes.wide().detach().numpy()))
    return out


_BITWISE_COUNT = getattr(np, "bitwise_count", None)  # numpy 2


def count_per_row(mask: np.ndarray) -> np.ndarray:
    """Each row's count of True, float64: for many rows, 8 at a time (the rows read as uint64,
    each True a 1 byte: ``bitwise_count`` counts them), 2-3x faster than a ``count_nonzero``
    per row, which is faster for a few long rows."""
    rows, size = mask.shape
    if _BITWISE_COUNT is not None and rows > 8 and size % 8 == 0 and mask.flags.c_contiguous:
        return _BITWISE_COUNT(mask.view(np.uint64)).sum(axis=1, dtype=np.int64).astype(np.float64)
    return np.array([np.count_nonzero(row) for row in mask], dtype=np.float64)


#: Big groups of rows are read in blocks of this many elements (1 MiB of float32): all the
#: passes over a block run while it is still in the core's cache (the health reductions
#: make about ten), and their scratch arrays are small.
ROWS_BLOCK = 1 << 18


def row_blocks(n_rows: int, size: int):
    """``(top, bottom, left, right)`` of the blocks of a ``[n_rows, size]`` array: whole rows
    together while they are short, pieces of one row when long."""
    width = min(size, ROWS_BLOCK)
    height = max(1, min(n_rows, ROWS_BLOCK // width))
    for top in range(0, n_rows, height):
        for left in range(0, size, width):
            yield top, min(n_rows, top + height), left, min(size, left + width)


def scratch_blocks(rows: torch.Tensor, dtype: torch.dtype, buffers):
    """``(top, bottom, block, scratch)`` for each block of ``rows`` (:func:`row_blocks`): the
    block's rows, and a scratch array of its shape in ``dtype``; one array (taken from
    ``buffers`` when given, and given back) serves every block."""
    blocks = list(row_blocks(*rows.shape))
    shape = (blocks[0][1] - blocks[0][0], blocks[0][3] - blocks[0][2])
    scratch = buffers.take(dtype, shape) if buffers is not None else torch.empty(shape, dtype=dtype)
    try:
        for top, bottom, left, right in blocks:
            yield top, bottom, rows[top:bottom, left:right], scratch[:bottom - top, :right - left]
    finally:
        if buffers is not None:
            buffers.give(scratch)


#: :func:`float32_moments` leaves rows whose mean exceeds this many standard deviations to
#: float64: centred on the float32-rounded mean, their moments would move by more than 1e-6.
FLOAT32_MOMENTS_MAX_MEAN = 10.0
#: ... and scales deviations only in rows whose largest lies outside [2^-30, 2^30): within,
#: their 4th powers neither underflow nor overflow float32, nor do sums of 2^24 of them.
MOMENTS_UNSCALED_EXPONENTS = 30


def float32_moments(rows: torch.Tensor, mean: np.ndarray, low: np.ndarray, high: np.ndarray,
                     buffers) -> Optional[Dict[str, np.ndarray]]:
    """``mean``, ``m2`` and ``m4`` of finite float32 rows, from their float64 means and extremes:
    deviations from the mean, in float32 (each rounded by at most half an ulp, without bias),
    scaled per row by the power of two that brings the largest below 1 where their 4th powers
    would leave float32's range (exact), squared twice in place; sums by torch in float32 per
    block (cascade sums of nonnegative terms: relative error near 1e-7), in float64 across
    blocks (:func:`row_blocks`), scaled back in float64. None when a row's mean is too far
    from 0 for float32 deviations (:data:`FLOAT32_MOMENTS_MAX_MEAN`)."""
    n_rows, n = rows.shape
    spread = np.maximum(high - mean, mean - low)
    exponent = np.clip(np.frexp(np.where(spread > 0, spread, 1.0))[1], -120, 120)  # spread < 2^exponent
    if not bool((np.abs(exponent) > MOMENTS_UNSCALED_EXPONENTS).any()):
        exponent[:] = 0
    inverse = torch.from_numpy(np.ldexp(1.0, -exponent).astype(np.float32))[:, None] if exponent.any() else None
    centre = torch.from_numpy(mean.astype(np.float32))[:, None]
    m2, m4 = np.zeros(n_rows), np.zeros(n_rows)
    for top, bottom, block, power in scratch_blocks(rows, torch.float32, buffers):
        torch.sub(block, centre[top:bottom], out=power)
        if inverse is not None:
            power.mul_(inverse[top:bottom])
        m2[top:bottom] += power.square_().sum(dim=1).numpy()
        m4[top:bottom] += power.square_().sum(dim=1).numpy()
    m2 *= np.ldexp(1.0, 2 * exponent)
    if bool((mean * mean > FLOAT32_MOMENTS_MAX_MEAN ** 2 * m2 / n).any()):
        return None
    return {"mean": mean, "m2": m2, "m4": m4 * np.ldexp(1.0, 4 * exponent)}

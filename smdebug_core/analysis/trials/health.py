"""Statistics derived from the training-health collections (docs/format.md 8.4), each defined
once here for the trial, the report and the rules: the L2 norm of a value (:func:`l2_norm`) and
the update-to-weight ratio ``l2(update/<w>) / l2(<w>)`` (:func:`update_ratio`), of each layer at
each step both were saved (:func:`update_ratio_table`).

The weight saved at a step is its value before that step's optimizer update (PyTorch
saves parameters when the step begins), the update its change in that step: the ratio is the
step's relative change of the layer. Either L2 may be saved as a reduction or computed from
a saved full value.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ...collections import UPDATE_PREFIX
from .table import Table

RATIO_LABEL = "update_ratio"


def l2_norm(value) -> float:
    """The L2 norm of a value, flattened, in float64. Where a step holds both a tensor's value
    and its saved ``l2``, the value's is used (the rules' ``StepView.l2``)."""
    return float(np.linalg.norm(np.asarray(value, dtype=np.float64).ravel()))


def update_ratio(update_l2, weight_l2, epsilon: float = 0.0):
    """``update_l2 / (weight_l2 + epsilon)``: a layer's relative change in a step (a zero weight
    gives inf, 0/0 NaN); floats or numpy arrays (element by element)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.divide(np.asarray(update_l2, np.float64), np.asarray(weight_l2, np.float64) + epsilon)
    return float(out) if np.ndim(out) == 0 else out


def weight_update_ratio(before, after, epsilon: float = 0.0) -> float:
    """The update ratio of a weight saved whole at two steps: ``l2(after - before) / l2(before)``."""
    before = np.asarray(before, np.float64)
    return update_ratio(l2_norm(np.asarray(after, np.float64) - before), l2_norm(before), epsilon)


def update_ratio_table(trial, *, mode=None, workers=None, progress: Optional[bool] = None,
                       l2_rows: Optional[Table] = None) -> Table:
    """Rows of ``tensor`` = the weight's name, ``reduction`` = ``"update_ratio"``, ``value`` =
    the ratio, for every (step, worker) at which both L2 norms are known (a zero weight gives inf).
    ``l2_rows``: a table the caller already read that holds those L2 norms (``to_table(...,
    reductions=["l2"])`` of the updates and their weights, other rows ignored); else they are read."""
    known = set(trial.tensor_names())
    updates = sorted(n for n in known if n.startswith(UPDATE_PREFIX) and n[len(UPDATE_PREFIX):] in known)
    if not updates:
        return Table.empty()
    weights = [n[len(UPDATE_PREFIX):] for n in updates]
    table = l2_rows if l2_rows is not None else trial.to_table(
        updates + weights, reductions=["l2"], mode=mode, workers=workers, progress=progress)
    if not len(table):
        return Table.empty()
    t_codes, t_cats = table.texts["tensor"]
    w_codes, w_cats = table.texts["worker"]
    code_of = {name: i for i, name in enumerate(t_cats)}
    # The weight's code for each row: an update row maps to its weight's, a weight row to its own.
    weight_code = np.array([code_of.get(name[len(UPDATE_PREFIX):], -1) if name.startswith(UPDATE_PREFIX)
                            else i for i, name in enumerate(t_cats)], np.int64)[t_codes]
    is_update = np.array([name.startswith(UPDATE_PREFIX) for name in t_cats], bool)[t_codes]
    steps = table.numbers["step"].astype(np.int64)
    key = (weight_code * (len(w_cats) + 1) + w_codes.astype(np.int64)) * (int(steps.max()) + 1) + steps
    r_codes, r_cats = table.texts["reduction"]
    is_l2 = r_codes == (r_cats.index("l2") if "l2" in r_cats else -1)  # not a 1-element tensor's own value
    upd, wgt = np.flatnonzero(is_l2 & is_update & (weight_code >= 0)), np.flatnonzero(is_l2 & ~is_update)
    _, at_u, at_w = np.intersect1d(key[upd], key[wgt], assume_unique=False, return_indices=True)
    rows_u, rows_w = upd[at_u], wgt[at_w]
    ratio = update_ratio(table.numbers["value"][rows_u], table.numbers["value"][rows_w])
    order = np.lexsort((steps[rows_u], w_codes[rows_u], weight_code[rows_u]))
    rows_u, rows_w, ratio = rows_u[order], rows_w[order], ratio[order]
    m_codes, m_cats = table.texts["mode"]
    return Table({"step": steps[rows_u], "mode_step": table.numbers["mode_step"][rows_u], "value": ratio},
                 {"mode": (m_codes[rows_u], m_cats), "worker": (w_codes[rows_u], w_cats),
                  "tensor": (t_codes[rows_w], t_cats), "reduction": (np.zeros(len(rows_u), np.int64), [RATIO_LABEL])})

"""The order a hook produced a run's tensors in, read from where their records start.

A step's records are written in the order the hook captured them: for PyTorch, parameters in
the order the model registers them, module outputs in forward order. Layers shown in that
order read as the model does (an encoder before its decoder), which no sort of names gives.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np


def production_order(trial, names: Sequence[str]) -> Dict[str, int]:
    """A rank for each of ``names`` saved in the step (and worker) holding the most of their
    records: their records' order in that step's event file. Names not saved there are left
    out (the caller orders them after the others)."""
    log = trial._index.log
    cols = log.arrays()
    ids = {log.tensors.ids[n]: n for n in names if n in log.tensors.ids}
    if not ids or not len(cols.get("step", ())):
        return {}
    keep = np.isin(cols["tensor"], np.fromiter(ids, np.int64, len(ids)))
    if not keep.any():
        return {}
    steps, workers = cols["step"][keep], cols["worker"][keep]
    tensors, starts = cols["tensor"][keep], cols["start"][keep]
    key = steps * (int(workers.max()) + 1) + workers
    values, counts = np.unique(key, return_counts=True)
    chosen = key == values[int(np.argmax(counts))]
    ranks: Dict[str, int] = {}
    for tensor_id in tensors[chosen][np.argsort(starts[chosen], kind="stable")].tolist():
        ranks.setdefault(ids[tensor_id], len(ranks))
    return ranks

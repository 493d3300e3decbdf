"""Reductions computed from saved full values, for ``Trial.to_table(..., reductions=[...])``.

A tensor saved whole (weights every 50 steps, say) has no saved ``l2`` to plot; this
module reads its values and computes the asked reductions with the reference definitions
of :mod:`smdebug.reductions` (what a saved reduction of the same value holds). Values are
read a few steps at a time, so a large tensor over many steps never sits in memory whole.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from ...modes import ModeKeys
from ...reduction_config import ALLOWED_NORMS, ALLOWED_REDUCTIONS, reduction_label, split_reduction_label
from ...reductions import reduce_many
from .locations import ReadRequest
from .table import Table, sorted_codes

#: Steps read together (each read's values are reduced, then dropped).
_STEPS_PER_READ = 32


def parse_reductions(reductions: Iterable[str]) -> List[Tuple[str, bool]]:
    """``["l2", "abs_max"]`` as reduction keys ``[("l2", False), ("max", True)]``; ValueError
    naming the allowed names otherwise."""
    allowed = ALLOWED_REDUCTIONS + ALLOWED_NORMS
    keys = []
    for text in ([reductions] if isinstance(reductions, str) else list(reductions)):
        op, is_abs = split_reduction_label(text) if isinstance(text, str) else (text, False)
        if op not in allowed:
            raise ValueError(f"unknown reduction {text!r}; allowed: {', '.join(allowed)}, each also as abs_NAME")
        if (op, is_abs) not in keys:
            keys.append((op, is_abs))
    return keys


def computed_table(trial, names: Sequence[str], keys: List[Tuple[str, bool]], modes: Optional[Set[ModeKeys]],
                   steps: Optional[Set[int]], workers: Optional[Set[str]], show_incomplete_steps: bool,
                   saved: Table, progress: Optional[bool]) -> Table:
    """Rows of the reductions ``keys`` of the tensors ``names`` computed from their saved
    values, where ``saved`` (the saved rows) has no such row; scalars are left out (their
    value is its own reduction)."""
    index = trial._steps
    to_mode = index.global_to_mode
    out_steps: List[int] = []
    out_values: List[float] = []
    out_tensor: List[str] = []
    out_worker: List[str] = []
    out_label: List[str] = []
    labels = [reduction_label(*k) for k in keys]
    # A run store says which tensors have values at all without building their records.
    with_values = getattr(trial._index, "names_with_values", None)
    with_values = with_values() if with_values is not None else None
    tensors = [trial.tensor(name) for name in names if with_values is None or name in with_values]
    tensors = [tensor for tensor in tensors if not tensor._is_scalar() and tensor._locations]
    if not tensors:
        return Table.empty()
    have = _saved_keys(saved, {tensor.name for tensor in tensors})
    for tensor in tensors:
        name = tensor.name
        requests = []
        for g in tensor.steps(show_incomplete_steps=show_incomplete_steps):
            if modes is not None or steps is not None:
                mode, mode_step = to_mode[g]
                if modes is not None and mode not in modes:
                    continue
                if steps is not None and (mode_step if modes is not None else g) not in steps:
                    continue
            for worker, location in (tensor._locations.get(g) or {}).items():
                if workers is not None and worker not in workers:
                    continue
                wanted = [i for i, label in enumerate(labels) if (name, label, worker, g) not in have]
                if wanted:
                    requests.append(ReadRequest((g, worker, tuple(wanted)), location, g, worker))
        for at in range(0, len(requests), _STEPS_PER_READ):
            for (g, worker, wanted), value in tensor._read(requests[at:at + _STEPS_PER_READ], progress).items():
                if value.dtype.kind not in "biufc" or value.size == 0:
                    continue
                for i, result in zip(wanted, reduce_many(value, [keys[i] for i in wanted])):
                    out_steps.append(g)
                    out_values.append(float(result))
                    out_tensor.append(name)
                    out_worker.append(worker)
                    out_label.append(labels[i])
    if not out_steps:
        return Table.empty()
    texts = {column: _codes(items) for column, items in
             (("tensor", out_tensor), ("worker", out_worker), ("reduction", out_label))}
    return Table.build(np.ones(len(out_steps), bool), np.asarray(out_steps, np.int64), texts,
                       np.asarray(out_values), index.arrays(), index.worker_step_conflicts)


def _saved_keys(saved: Table, names: Set[str]) -> Set[Tuple[str, str, str, int]]:
    """``(tensor, reduction, worker, step)`` of the saved rows of ``names`` (only theirs: the
    saved rows of a large run are millions, the tensors saved whole usually few)."""
    if not len(saved):
        return set()
    codes, items = saved.texts["tensor"]
    keep = np.isin(codes, np.asarray([i for i, n in enumerate(items) if n in names], np.int64))
    columns = []
    for column in ("tensor", "reduction", "worker"):
        codes, items = saved.texts[column]
        columns.append([items[c] for c in codes[keep].tolist()])
    return set(zip(*columns, saved.numbers["step"][keep].tolist()))


def _codes(items: List[str]):
    categories = sorted(set(items))
    rank: Dict[str, int] = {c: k for k, c in enumerate(categories)}
    return sorted_codes(np.fromiter((rank[i] for i in items), np.int64, len(items)), categories)

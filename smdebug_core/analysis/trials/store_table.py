"""``Trial.to_table`` of a run store (docs/format.md 10): the rows come straight from the
statistics columns the trial holds (store_index.py), no record is read.

The table is sorted by tensor, reduction, worker and step (table.py). Each worker's rows
come step after step (segments in order, steps in order within them), so a *stable* sort
on one small integer key (tensor, reduction, worker) puts them in that order; numpy sorts
integers of 16 bits by radix, so the key is sorted in one or two radix passes, O(rows),
instead of a comparison sort of 64-bit keys (which takes seconds for ten million rows).
Rows seen again later for the same (worker, step, tensor, reduction) replace the earlier
ones. Whole tensors holding one number, and reductions kept as whole records (rare), are
read from their records and added.
"""
from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional

import numpy as np

from ...exceptions import CorruptRecord, MissingEventFile
from ...modes import ModeKeys
from ...reduction_config import reduction_label
from .locations import ReadRequest, TensorLocation
from .record_walk import scalar_of
from .table import Table, _code_dtype

logger = logging.getLogger("smdebug.trials")

_MODE_VALUES = max(m.value for m in ModeKeys) + 1


def _monotone(part) -> bool:
    """Whether a segment's statistics rows come in step order (cached on the segment)."""
    found = getattr(part, "_monotone", None)
    if found is None or found[0] != part.version:
        s = part.step
        found = part._monotone = (part.version, bool(len(s) < 2 or (s[1:] >= s[:-1]).all()))
    return found[1]


def _stable_order(key: np.ndarray, size: int) -> np.ndarray:
    """A stable argsort of non-negative ``key`` < ``size``: radix passes of 16 bits."""
    if size <= 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if size <= 1 << 32:
        first = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
        return first[np.argsort((key >> 16).astype(np.uint16)[first], kind="stable")]
    return np.argsort(key, kind="stable")


def _ranks(used_ids: np.ndarray, items: List[str], size: int):
    """``(rank per id, sorted names)`` of the ids used (others rank 0, unused)."""
    names = sorted(items[i] for i in used_ids.tolist())
    position = {n: k for k, n in enumerate(names)}
    rank = np.zeros(size, np.int64)
    for i in used_ids.tolist():
        rank[i] = position[items[i]]
    return rank, names


class _Selection:
    """What ``to_table`` asked for, as lookups over the index's ids and step filters."""

    def __init__(self, index, names, modes, steps, include_incomplete: bool, labels):
        self.index = index
        self.wanted = np.zeros(len(index.names.items), bool)
        for name in names:
            i = index.names.ids.get(name)
            if i is not None:
                self.wanted[i] = True
        self.label_wanted = np.asarray([labels is None or i == 0 or label in labels
                                        for i, label in enumerate(index.labels.items)], bool)
        self.every_name, self.every_label = bool(self.wanted.all()), bool(self.label_wanted.all())
        self.modes = modes
        self.mode_wanted = None
        if modes is not None:
            self.mode_wanted = np.zeros(_MODE_VALUES, bool)
            self.mode_wanted[[m.value for m in modes]] = True
        self.step_values = None if steps is None else np.asarray(sorted(steps), np.int64)
        step_index = index.steps
        self.late_cut = None
        if not include_incomplete and not step_index.loaded_all_steps:
            self.late_cut = step_index.last_complete_step

    def step_mask(self, step: np.ndarray, mode: np.ndarray, mode_step: np.ndarray) -> Optional[np.ndarray]:
        """Which of these rows (or steps) the mode, step and completeness filters keep (None: all)."""
        mask = None
        if self.mode_wanted is not None:
            mask = self.mode_wanted[mode]
        if self.step_values is not None:
            m = np.isin(mode_step if self.modes is not None else step, self.step_values)
            mask = m if mask is None else mask & m
        if self.late_cut is not None and len(step) and step.max() > self.late_cut:
            late = step > self.late_cut
            late_steps = np.unique(step[late])
            done = late_steps[np.fromiter(map(self.index.steps.is_complete, late_steps.tolist()), bool,
                                          len(late_steps))]
            m = ~late | np.isin(step, done)
            mask = m if mask is None else mask & m
        return mask


def store_table(index, names, modes, steps, workers, include_incomplete: bool, labels, reader,
                on_error: str) -> Table:
    """The rows of ``Trial.to_table`` (its arguments, parsed) of a run store's ``index``."""
    every = [p for p in index.loaded_parts() if workers is None or p.worker in workers]
    parts = [p for p in every if len(p)]
    selection = _Selection(index, names, modes, steps, include_incomplete, labels)
    table = _uniform_table(index, parts, selection)
    if table is None:
        table = _block_table(index, parts, selection)
    if table is None:
        table = _general_table(index, parts, selection)
    extra = _whole_tensor_rows(index, every, set(names), labels, modes, steps, selection.late_cut, reader,
                               on_error)
    return Table.concat(table, extra) if extra is not None else table


def _uniform_table(index, parts, selection: _Selection) -> Optional[Table]:
    """The table of segments that all hold the same rows at every step (the usual run), or
    None: each segment's rows are a ``steps x width`` matrix, so the table is their kept
    columns, transposed and laid side by side worker by worker; no sort."""
    if not parts:
        return Table.empty()
    templates = [p.template() for p in parts]
    first = templates[0]
    if first is None or any(t is None or (t is not first and not t.same_rows(first)) for t in templates[1:]):
        return None
    previous: Dict[int, int] = {}
    for part, t in zip(parts, templates):  # each worker's steps increase from segment to segment
        if previous.get(part.worker_id, -1) >= t.step[0]:
            return None
        previous[part.worker_id] = int(t.step[-1])
    keep = selection.wanted[first.tensor] & selection.label_wanted[first.label]
    kept = np.flatnonzero(keep)
    if not len(kept):
        return Table.empty()
    t_rank, t_names = _ranks(np.unique(first.tensor[kept]), index.names.items, len(index.names.items))
    l_rank, l_names = _ranks(np.unique(first.label[kept]), index.labels.items, len(index.labels.items))
    perm = kept[np.lexsort((l_rank[first.label[kept]], t_rank[first.tensor[kept]]))]
    identity = len(perm) == first.width and bool((perm == np.arange(first.width)).all())
    masks = [selection.step_mask(t.step, t.mode, t.mode_step) for t in templates]
    sizes = [t.blocks if m is None else int(m.sum()) for t, m in zip(templates, masks)]
    total = sum(sizes)
    if not total:
        return Table.empty()
    width = len(perm)
    value = np.empty((width, total))
    step = np.empty((width, total), np.int64)
    mode_step = np.empty((width, total), np.int64)
    mode = np.empty((width, total), np.int8)
    worker_sizes: Dict[int, int] = {}
    at = 0
    for part, t, m, size in zip(parts, templates, masks, sizes):
        if not size:
            continue
        rows = part.value.reshape(t.blocks, t.width)
        b_step, b_mode, b_mode_step = t.step, t.mode, t.mode_step
        if m is not None and size < t.blocks:
            rows, b_step, b_mode, b_mode_step = rows[m], b_step[m], b_mode[m], b_mode_step[m]
        value[:, at:at + size] = rows.T if identity else rows[:, perm].T
        step[:, at:at + size] = b_step
        mode_step[:, at:at + size] = b_mode_step
        mode[:, at:at + size] = b_mode
        worker_sizes[part.worker_id] = worker_sizes.get(part.worker_id, 0) + size
        at += size
    w_ids = np.fromiter(worker_sizes, np.int64, len(worker_sizes))
    w_rank, w_names = _ranks(w_ids, index.workers.items, len(index.workers.items))
    worker_codes = np.repeat(w_rank[w_ids].astype(_code_dtype(len(w_names))),
                             np.fromiter(worker_sizes.values(), np.int64, len(worker_sizes)))
    mode = mode.reshape(-1)
    present = np.flatnonzero(np.bincount(mode, minlength=_MODE_VALUES))
    mode_codes = np.zeros(_MODE_VALUES, np.int8)
    mode_codes[present] = np.arange(len(present))
    texts = {
        "tensor": (np.repeat(t_rank[first.tensor[perm]].astype(_code_dtype(len(t_names))), total), t_names),
        "reduction": (np.repeat(l_rank[first.label[perm]].astype(_code_dtype(len(l_names))), total), l_names),
        "worker": (np.tile(worker_codes, width), w_names),
        "mode": (mode_codes[mode], [ModeKeys(int(v)).name for v in present]),
    }
    return Table({"step": step.reshape(-1), "mode_step": mode_step.reshape(-1), "value": value.reshape(-1)}, texts)


def _block_table(index, parts, selection: _Selection) -> Optional[Table]:
    """The table of segments whose steps hold one of a few (tensor, label) sequences each
    (a loss every step, reductions every tenth...), or None. Each row's place in the table
    is computed, not sorted for: a pair's rows of one worker come in step order, so a row of
    step block ``b`` lands at its group's start plus the number of earlier blocks of the
    worker whose sequence holds the pair (the same count for every pair held by the same
    set of sequences)."""
    if not parts:
        return Table.empty()
    blocks = [p.blocks(index.template_of) for p in parts]
    if any(b is None for b in blocks):
        return None
    previous: Dict[int, int] = {}
    for part, b in zip(parts, blocks):
        if previous.get(part.worker_id, -1) >= b.step[0]:
            return None
        previous[part.worker_id] = int(b.step[-1])
    used = np.unique(np.concatenate([b.template for b in blocks]))
    if len(used) > 62:
        return None
    slot = {int(g): i for i, g in enumerate(used.tolist())}
    templates = [index.templates[g] for g in used.tolist()]
    kept = [np.flatnonzero(selection.wanted[t] & selection.label_wanted[lab]) for t, lab in templates]
    if not any(len(k) for k in kept):
        return Table.empty()
    t_used = np.unique(np.concatenate([t[k] for (t, _), k in zip(templates, kept)]))
    l_used = np.unique(np.concatenate([lab[k] for (_, lab), k in zip(templates, kept)]))
    t_rank, t_names = _ranks(t_used, index.names.items, len(index.names.items))
    l_rank, l_names = _ranks(l_used, index.labels.items, len(index.labels.items))
    w_ids = np.unique(np.asarray([p.worker_id for p in parts], np.int64))
    w_rank, w_names = _ranks(w_ids, index.workers.items, len(index.workers.items))
    n_l, n_w = len(l_names), len(w_names)
    size = len(t_names) * n_l * n_w
    # Per used sequence, its kept positions' pair keys (without the worker) and signatures:
    # the set of sequences holding each pair, as a bit mask.
    pair_key = [(t_rank[t[k]] * n_l + l_rank[lab[k]]) * n_w for (t, lab), k in zip(templates, kept)]
    holders: Dict[int, int] = {}
    for i, keys in enumerate(pair_key):
        for key in keys.tolist():
            holders[key] = holders.get(key, 0) | (1 << i)
    signatures = sorted(set(holders.values()))
    sig_index = {sig: i for i, sig in enumerate(signatures)}
    pair_sig = [np.asarray([sig_index[holders[key]] for key in keys.tolist()], np.int64) for keys in pair_key]
    sig_members = np.asarray([[(sig >> i) & 1 for i in range(len(used))] for sig in signatures], bool)

    # The kept blocks of each segment, and per worker the count of earlier blocks holding
    # each signature.
    plan = []  # (part, blocks, kept block indices, their slots, worker)
    per_worker: Dict[int, list] = {}
    for part, b in zip(parts, blocks):
        mask = selection.step_mask(b.step, b.mode, b.mode_step)
        chosen = np.arange(len(b.step)) if mask is None else np.flatnonzero(mask)
        slots = np.asarray([slot[g] for g in b.template[chosen].tolist()], np.int64) if len(chosen) else \
            np.zeros(0, np.int64)
        plan.append((part, b, chosen, slots))
        per_worker.setdefault(part.worker_id, []).append(slots)
    counts = np.zeros(size, np.int64)
    earlier: Dict[int, np.ndarray] = {}  # worker -> (signatures x its kept blocks) exclusive counts
    for w, pieces in per_worker.items():
        slots = np.concatenate(pieces)
        holds = sig_members[:, slots]  # signature x block: does the block's sequence hold it
        cum = np.zeros((len(signatures), len(slots) + 1), np.int64)
        np.cumsum(holds, axis=1, out=cum[:, 1:])
        earlier[w] = cum
        per_slot = np.bincount(slots, minlength=len(used))
        for i, keys in enumerate(pair_key):
            if per_slot[i]:
                np.add.at(counts, keys + w_rank[w], per_slot[i])
    total = int(counts.sum())
    if not total:
        return Table.empty()
    group_start = np.zeros(size, np.int64)
    np.cumsum(counts[:-1], out=group_start[1:])
    value = np.empty(total)
    step = np.empty(total, np.int64)
    mode_step = np.empty(total, np.int64)
    mode = np.empty(total, np.int8)
    # Pairs every used sequence holds (the usual bulk: all but a loss saved more often, say)
    # have a row at every kept block of their worker: those are gathered into one matrix per
    # worker (blocks x pairs) and laid out by rows of its transpose; the other pairs' rows
    # are placed one by one (scattered).
    every = len(used) and sig_index.get((1 << len(used)) - 1)
    full_keys = sorted(k for k, sig in holders.items() if sig == (1 << len(used)) - 1)
    full_column = {k: c for c, k in enumerate(full_keys)}
    full_pos, part_pos = [], []
    for i in range(len(used)):
        is_full = pair_sig[i] == every if full_keys else np.zeros(len(kept[i]), bool)
        order = np.argsort([full_column.get(k, 0) for k in pair_key[i][is_full].tolist()], kind="stable")
        full_pos.append(kept[i][is_full][order])
        part_pos.append(np.flatnonzero(~is_full))
    matrices: Dict[int, list] = {}  # worker -> [blocks x full pairs pieces, steps, modes, mode steps]
    offset: Dict[int, int] = {}  # worker -> kept blocks of its earlier segments
    for part, b, chosen, slots in plan:
        w = part.worker_id
        base = offset.get(w, 0)
        offset[w] = base + len(chosen)
        cum = earlier[w]
        if full_keys:
            piece = np.empty((len(chosen), len(full_keys)))
            for i in np.unique(slots).tolist():
                local = np.flatnonzero(slots == i)
                piece[local] = part.value[b.start[chosen[local]][:, None] + full_pos[i][None, :]]
            m = matrices.setdefault(w, [[], [], [], []])
            for target, column in zip(m, (piece, b.step[chosen], b.mode[chosen], b.mode_step[chosen])):
                target.append(column)
        for i in np.unique(slots).tolist():
            positions = part_pos[i]
            if not len(positions):
                continue
            local = np.flatnonzero(slots == i)  # this sequence's kept blocks of the segment
            at = chosen[local]
            rows = b.start[at][:, None] + kept[i][positions][None, :]
            dest = (group_start[pair_key[i][positions] + w_rank[w]][None, :]
                    + cum[pair_sig[i][positions]][:, base + local].T)
            value[dest] = part.value[rows]
            step[dest] = b.step[at][:, None]
            mode_step[dest] = b.mode_step[at][:, None]
            mode[dest] = b.mode[at][:, None]
    for w, (pieces, b_step, b_mode, b_mode_step) in matrices.items():
        by_pair = np.ascontiguousarray(np.concatenate(pieces).T)
        b_step, b_mode, b_mode_step = np.concatenate(b_step), np.concatenate(b_mode), np.concatenate(b_mode_step)
        n = len(b_step)
        if not n:
            continue
        for c, key in enumerate(full_keys):
            at = int(group_start[key + w_rank[w]])
            value[at:at + n] = by_pair[c]
            step[at:at + n] = b_step
            mode[at:at + n] = b_mode
            mode_step[at:at + n] = b_mode_step
    return Table({"step": step, "mode_step": mode_step, "value": value},
                 _text_columns(counts, mode, (t_names, l_names, w_names)))


def _text_columns(counts: np.ndarray, mode: np.ndarray, names) -> Dict[str, tuple]:
    """The text columns of rows laid out in pair-key order: ``counts[key]`` rows for each key
    (``(tensor * n_labels + label) * n_workers + worker``; ``names`` are the three sorted
    categories), and ``mode`` per row."""
    t_names, l_names, w_names = names
    n_l, n_w = len(l_names), len(w_names)
    used = np.flatnonzero(counts)
    runs = counts[used]
    texts = {}
    for column, part_of_key, cats in (("tensor", used // (n_l * n_w), t_names),
                                      ("reduction", (used // n_w) % n_l, l_names),
                                      ("worker", used % n_w, w_names)):
        texts[column] = (np.repeat(part_of_key.astype(_code_dtype(len(cats))), runs), cats)
    present = np.flatnonzero(np.bincount(mode, minlength=_MODE_VALUES))
    mode_codes = np.zeros(_MODE_VALUES, np.int8)
    mode_codes[present] = np.arange(len(present))
    texts["mode"] = (mode_codes[mode], [ModeKeys(int(v)).name for v in present])
    return texts


def _general_table(index, parts, selection: _Selection) -> Table:
    """The table of any segments: rows selected by masks, then stably sorted."""
    pieces: Dict[str, list] = {k: [] for k in ("step", "mode", "mode_step", "tensor", "label", "value", "worker")}
    monotone = True
    last_step: Dict[int, int] = {}
    for part in parts:
        mask = None
        if not selection.every_name:
            mask = selection.wanted[part.tensor]
        if not selection.every_label:
            m = selection.label_wanted[part.label]
            mask = m if mask is None else mask & m
        m = selection.step_mask(part.step, part.mode, part.mode_step)
        if m is not None:
            mask = m if mask is None else mask & m
        columns = {"step": part.step, "mode": part.mode, "mode_step": part.mode_step, "tensor": part.tensor,
                   "label": part.label, "value": part.value}
        if mask is not None:
            if not mask.any():
                continue
            if not mask.all():
                columns = {k: v[mask] for k, v in columns.items()}
        for k, v in columns.items():
            pieces[k].append(v)
        pieces["worker"].append(np.full(len(columns["step"]), part.worker_id, np.int32))
        s = columns["step"]
        if monotone:
            previous = last_step.get(part.worker_id)
            monotone = _monotone(part) and (previous is None or previous <= s[0])
            last_step[part.worker_id] = int(s[-1])
    return _table(index, pieces, monotone)


def _table(index, pieces: Dict[str, list], monotone: bool) -> Table:
    if not pieces["step"]:
        return Table.empty()
    c = {k: (np.concatenate(v) if len(v) > 1 else v[0]) for k, v in pieces.items()}
    del pieces
    n = len(c["step"])
    # Ranks of the names, labels and workers used, in sorted order: the key's parts.
    t_rank, t_names = _ranks(np.flatnonzero(np.bincount(c["tensor"])), index.names.items, len(index.names.items))
    l_rank, l_names = _ranks(np.flatnonzero(np.bincount(c["label"])), index.labels.items, len(index.labels.items))
    w_rank, w_names = _ranks(np.flatnonzero(np.bincount(c["worker"])), index.workers.items, len(index.workers.items))
    n_t, n_l, n_w = len(t_names), len(l_names), len(w_names)
    size = n_t * n_l * n_w
    # The key of each (tensor, label) pair through one table, then the worker.
    pair = (t_rank[:, None] * n_l + l_rank[None, :]) * n_w
    pair = pair.astype(np.int32 if size < 1 << 31 else np.int64)
    key = pair[c["tensor"], c["label"]]
    if n_w > 1:
        key += w_rank.astype(key.dtype)[c["worker"]]
    if monotone:
        order = _stable_order(key, size)
    else:  # a step written again later, or out of order: sort by step too (stable: later rows last)
        order = np.lexsort((c["step"], key))
    key = key[order]
    step = c["step"][order]
    # A (worker, step, tensor, reduction) seen again: the later row wins.
    same = (key[1:] == key[:-1]) & (step[1:] == step[:-1])
    if same.any():
        keep = np.ones(n, bool)
        keep[:-1] = ~same
        order, key, step = order[keep], key[keep], step[keep]
    numbers = {"step": step, "mode_step": c["mode_step"][order], "value": c["value"][order]}
    mode = c["mode"][order]
    del c, order
    return Table(numbers, _text_columns(np.bincount(key, minlength=size), mode, (t_names, l_names, w_names)))


def _whole_tensor_rows(index, parts, names, labels, modes, steps, late_cut, reader, on_error) -> Optional[Table]:
    """Rows of whole records holding one number (a tensor's value, or a reduction kept as a
    record), read from the chunk files; None when there are none."""
    step_index = index.steps
    requests = []
    for part in parts:
        for row in part.tensor_rows:
            g, mode, mode_step, record_name, kind, file, offset, length, crc, dtype, shape, _ = row
            if kind != "value":
                continue
            # The steps first: a bulk read asks for a few hundred steps of a run's thousands.
            if steps is not None and (mode_step if modes is not None else g) not in steps:
                continue
            base, key = index.tensor_row_name(record_name)
            if base not in names:
                continue
            label = "" if key is None else reduction_label(*key)
            if labels is not None and label and label not in labels:
                continue
            if key is None and (shape is None or math.prod(shape) != 1):
                continue
            if modes is not None and ModeKeys(mode) not in modes:
                continue
            if late_cut is not None and g > late_cut and not step_index.is_complete(g):
                continue
            requests.append((g, mode, mode_step, part.worker, base, label,
                             ReadRequest(None, TensorLocation(file, offset, length, crc, record_name), g, part.worker)))
    if not requests:
        return None
    rows = []
    errors = []
    for g, mode, mode_step, worker, base, label, request in requests:
        location = request.location
        try:
            data = reader.read(location.event_file, [(location.start, location.length)], g, base)[0]
            number = scalar_of(reader.decode(memoryview(data), request))
        except (CorruptRecord, MissingEventFile) as exc:
            if on_error == "raise":
                raise
            errors.append(str(exc))
            continue
        if number is not None:
            rows.append((g, mode, mode_step, worker, base, label, number))
    if errors:
        logger.warning("smdebug: %d record(s) could not be read and are left out of the table; the first: %s",
                       len(errors), errors[0])
    if not rows:
        return None
    g, mode, mode_step, worker, base, label, number = zip(*rows)
    texts = {}
    for column, items in (("worker", worker), ("tensor", base), ("reduction", label),
                          ("mode", [ModeKeys(m).name for m in mode])):
        cats = sorted(set(items), key=(lambda m: ModeKeys[m].value) if column == "mode" else None)
        rank = {c: k for k, c in enumerate(cats)}
        texts[column] = (np.asarray([rank[x] for x in items], _code_dtype(len(cats))), cats)
    numbers = {"step": np.asarray(g, np.int64), "mode_step": np.asarray(mode_step, np.int64),
               "value": np.asarray(number, np.float64)}
    order = np.lexsort((numbers["step"], texts["worker"][0], texts["reduction"][0], texts["tensor"][0]))
    return Table({k: v[order] for k, v in numbers.items()}, {k: (c[order], cats) for k, (c, cats) in texts.items()})

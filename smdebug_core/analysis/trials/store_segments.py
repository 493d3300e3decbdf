"""One worker's segment of a run store as the trial holds it (:class:`Part`): its statistics
rows in numpy columns, read in two steps (steps when registered, values when first needed),
its tensors rows as tuples, and how its rows go step by step (:class:`Blocks`, :class:`Template`),
which lets tables and per-step lookups work without sorting. Used by store_index.py."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

class Part:
    """One worker's segment as read so far: statistics rows in columns, tensors rows as tuples."""

    def __init__(self, folder: str, worker: str, worker_id: int, number: int):
        self.folder = folder  # the worker as the store's folders name it
        self.worker = worker  # as the trial names it (a TensorFlow device name deserialized)
        self.worker_id = worker_id
        self.number = number
        self.sealed = False
        self.source = ""  # the file its rows came from, relative to the run
        self.live_size = -1  # bytes of the live file when it was read
        self.version = 0
        self.set_rows(np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64), None, [])

    def set_rows(self, step, mode, mode_step, rest, tensor_rows) -> None:
        """New contents. ``rest``: the other statistics columns, or a function giving them
        (read when first needed). ``tensor_rows``: ``(step, mode, mode_step, record name, kind,
        file, offset, length, crc32c, dtype, shape, placement)``."""
        self.step, self.mode, self.mode_step = step, mode, mode_step
        self._rest = rest
        self.loaded = not callable(rest)
        if self.loaded:
            self._take(rest)
        self.tensor_rows = tensor_rows
        self.version += 1
        self._groups = None
        self._template = None
        self._blocks = None
        self._present = None
        self._mode_present: Dict[int, np.ndarray] = {}
        lo = [int(step.min())] if len(step) else []
        hi = [int(step.max())] if len(step) else []
        if tensor_rows:
            t_steps = [r[0] for r in tensor_rows]
            lo.append(min(t_steps))
            hi.append(max(t_steps))
        self.lo = min(lo) if lo else None
        self.hi = max(hi) if hi else None

    def _take(self, rest) -> None:
        if rest is None:
            n = len(self.step)
            rest = (np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n), np.zeros(n, np.int32),
                    np.zeros(n, np.int8))
        self.tensor, self.label, self.value, self._dtype, self._ndim = rest

    # A sealed segment's dtype and ndim columns are read only when a value is made from a row
    # (tables need neither): ``_dtype`` is then None and ``_types`` the function that reads them.
    @property
    def dtype(self) -> np.ndarray:
        if self._dtype is None:
            self._load_types()
        return self._dtype

    @property
    def ndim(self) -> np.ndarray:
        if self._ndim is None:
            self._load_types()
        return self._ndim

    def _load_types(self) -> None:
        reader, self._types = getattr(self, "_types", None), None
        found = reader() if reader is not None else None
        if found is None:  # the file failed now (warned): numbers as float64 of shape ()
            found = (np.zeros(len(self.step), np.int32), np.zeros(len(self.step), np.int8))
        self._dtype, self._ndim = found

    def read_rest(self):
        """What :meth:`load` needs read from the file (any thread), or None."""
        reader = getattr(self._rest, "read", None) if not self.loaded else None
        return reader() if reader is not None else None

    def load(self, read=None) -> None:
        """Read the columns left for later (``read``: :meth:`read_rest`'s result); a file that
        fails now (it was warned about) leaves the segment without statistics rows."""
        if not self.loaded:
            rest, self._rest = self._rest, None
            columns = rest() if read is None else rest(read)
            if columns is None:
                self.step, self.mode, self.mode_step = self.step[:0], self.mode[:0], self.mode_step[:0]
            self._take(columns)
            self.loaded = True

    def __len__(self):
        return len(self.step)

    def blocks(self, templates) -> Optional["Blocks"]:
        """The segment step by step (:class:`Blocks`), or None; ``templates``: the index's
        :meth:`StoreIndex.template_of`."""
        if self._blocks is None:
            self._blocks = _find_blocks(self, templates) or False
        return self._blocks or None

    def template(self) -> Optional["Template"]:
        """The segment's rows as ``blocks x width`` when every step holds the same (tensor,
        label) sequence, once each, steps increasing (the usual segment); else None."""
        if self._template is None:
            self._template = _find_template(self) or False
        return self._template or None

    def rows_of(self, tensor_id: int) -> np.ndarray:
        """Indices of the statistics rows of a tensor, in row order."""
        template = self.template()
        if template is not None:
            where = np.flatnonzero(template.tensor == tensor_id)
            if not len(where):
                return where
            return (np.arange(template.blocks)[:, None] * template.width + where[None, :]).reshape(-1)
        if self._groups is None:
            t = self.tensor
            size = int(t.max()) + 1 if len(t) else 0
            order = np.argsort(t.astype(np.uint16) if size <= 1 << 16 else t, kind="stable")
            bounds = np.zeros(size + 1, np.int64)
            np.cumsum(np.bincount(t, minlength=size), out=bounds[1:])
            self._groups = (order, bounds)
        order, bounds = self._groups
        if tensor_id + 1 >= len(bounds):
            return order[:0]
        return order[bounds[tensor_id]:bounds[tensor_id + 1]]

    def present(self, mode: Optional[int] = None) -> np.ndarray:
        """The tensor ids with statistics rows (of one mode, when given)."""
        if mode is None:
            if self._present is None:
                self._present = np.flatnonzero(np.bincount(self.tensor)) if len(self.tensor) else self.tensor[:0]
            return self._present
        found = self._mode_present.get(mode)
        if found is None:
            t = self.tensor[self.mode == mode]
            found = self._mode_present[mode] = np.flatnonzero(np.bincount(t)) if len(t) else t[:0]
        return found


class Template:
    """A segment whose ``blocks`` steps each hold the same ``width`` rows: (``tensor``,
    ``label``) at each position, and each block's ``step``, ``mode`` and ``mode_step``."""

    def __init__(self, blocks, width, tensor, label, step, mode, mode_step):
        self.blocks, self.width = blocks, width
        self.tensor, self.label = tensor, label
        self.step, self.mode, self.mode_step = step, mode, mode_step

    def same_rows(self, other: "Template") -> bool:
        return np.array_equal(self.tensor, other.tensor) and np.array_equal(self.label, other.label)


class Blocks:
    """A segment's statistics rows step by step: block ``b`` (rows ``start[b]:start[b+1]``) holds
    step ``step[b]`` (increasing), one ``mode`` and ``mode_step``, and the (tensor, label)
    sequence of template ``template[b]`` (:meth:`StoreIndex.template_of`), no pair twice."""

    def __init__(self, start, step, mode, mode_step, template):
        self.start, self.step, self.mode, self.mode_step, self.template = start, step, mode, mode_step, template


def _find_blocks(part: Part, templates) -> Optional[Blocks]:
    """The segment's :class:`Blocks`, or None when its rows are not so (a step written twice,
    steps out of order, a pair twice in a step). ``templates``: ``(tensor, label) -> id``."""
    n = len(part)
    if not n:
        return None
    s = part.step
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    steps = s[start]
    if len(steps) > 1 and not (steps[1:] > steps[:-1]).all():
        return None
    widths = np.diff(np.r_[start, n])
    for column in (part.mode, part.mode_step):
        if not (column == np.repeat(column[start], widths)).all():
            return None
    tensor, label = part.tensor, part.label
    ids = np.empty(len(start), np.int64)
    bounds = np.r_[start, n].tolist()
    for b in range(len(start)):
        a, e = bounds[b], bounds[b + 1]
        found = templates(tensor[a:e], label[a:e])
        if found is None:
            return None
        ids[b] = found
    return Blocks(np.r_[start, n], steps, part.mode[start], part.mode_step[start], ids)


def _find_template(part: Part) -> Optional[Template]:
    n = len(part)
    if not n:
        return None
    s = part.step
    change = np.flatnonzero(s[1:] != s[:-1]) + 1
    blocks = len(change) + 1
    if n % blocks:
        return None
    width = n // blocks
    if blocks > 1 and not np.array_equal(change, np.arange(width, n, width)):
        return None
    steps = s[::width]
    if blocks > 1 and not (steps[1:] > steps[:-1]).all():
        return None
    t = part.tensor.reshape(blocks, width)
    label = part.label.reshape(blocks, width)
    mode = part.mode.reshape(blocks, width)
    mode_step = part.mode_step.reshape(blocks, width)
    if not ((t == t[:1]).all() and (label == label[:1]).all() and (mode == mode[:, :1]).all()
            and (mode_step == mode_step[:, :1]).all()):
        return None
    pairs = t[0].astype(np.int64) * (int(label[0].max()) + 1) + label[0]
    if len(np.unique(pairs)) != width:  # a (tensor, label) twice in a step: the later wins, not this way
        return None
    return Template(blocks, width, t[0].copy(), label[0].copy(), steps.copy(), mode[:, 0].copy(),
                     mode_step[:, 0].copy())

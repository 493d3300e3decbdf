"""A chunk of a saved run's small records (saved reductions, one-element values) kept as numpy
columns for the rules: :class:`ChunkColumns`, made by ``BulkSteps`` from ``Trial.to_table``.

Two uses:

* a step's view reads a tensor's rows from the columns when a rule first asks for that tensor
  (:class:`StepRows`), instead of turning every row of every step into Python objects up front;
* a rule asks whole-chunk questions answered with numpy once per chunk, then once per step in
  constant time (:meth:`ChunkColumns.covered`): "does every selected tensor have this
  reduction at this step, and is none of the values bad?". A rule whose answer is yes knows
  the outcome of its step without looking at each tensor (``Rule.settle_step``).
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Tuple

import numpy as np

ReductionKey = Tuple[str, bool]


class ChunkColumns:
    """Rows of ``steps`` sorted by (step, tensor), rows of one tensor at one step in the order
    read (so that, as in a dict filled row by row, the last row of a key wins).

    ``table``: ``Trial.to_table``'s Table; ``key_of_label``: reduction column text -> ``(op,
    abs)``, ``""`` for a value; a label it lacks counts as a value (as the dicts always did)."""

    def __init__(self, table, steps, key_of_label: Dict[str, object]):
        tensor_codes, tensors = table.texts["tensor"]
        label_codes, labels = table.texts["reduction"]
        self.names: List[str] = list(tensors)
        # Code -1 (no text) indexes the last element: "" for a name, None (skipped) for a key.
        self.keys: List[object] = [key_of_label.get(label, "") for label in labels] + [None]
        self._code_of = {name: i for i, name in enumerate(self.names)}
        step = np.asarray(table.numbers["step"], np.int64)
        tensor = np.where(tensor_codes < 0, len(self.names), tensor_codes).astype(np.int64)
        order = np.lexsort((tensor, step))
        self.step, self.tensor = step[order], tensor[order]
        self.label = np.asarray(label_codes)[order].astype(np.int64)
        self.value = np.asarray(table.numbers["value"], np.float64)[order]
        self.steps = np.unique(np.asarray(list(steps), np.int64))
        bounds = np.searchsorted(self.step, self.steps)
        self._bounds = np.r_[bounds, len(self.step)]
        self._position = {int(s): i for i, s in enumerate(self.steps.tolist())}
        self._summaries: Dict[Hashable, Tuple[np.ndarray, np.ndarray]] = {}

    def has_step(self, step: int) -> bool:
        return step in self._position

    def rows(self, step: int) -> "StepRows":
        i = self._position[step]
        return StepRows(self, int(self._bounds[i]), int(self._bounds[i + 1]))

    def tensor_rows(self, lo: int, hi: int, name: str) -> Tuple[int, int]:
        """The rows ``[start, stop)`` of ``name`` within one step's rows ``[lo, hi)``."""
        code = len(self.names) if name == "" else self._code_of.get(name)
        if code is None or lo == hi:
            return lo, lo
        start, stop = np.searchsorted(self.tensor[lo:hi], (code, code + 1))
        return lo + int(start), lo + int(stop)

    # --- whole-chunk questions ---------------------------------------------------------------
    def covered(self, step: int, cache_key: Hashable, selected: Callable[[List[str]], np.ndarray], count: int,
                key: Optional[ReductionKey], bad: Callable[[np.ndarray], np.ndarray],
                scale: Optional[Callable[[List[str]], np.ndarray]] = None) -> bool:
        """Whether ``count`` distinct tensors of the selection have a row at ``step`` (a row of
        reduction ``key``; any row a rule reads when ``key`` is None) and no such row's value
        is ``bad``. ``selected(names)`` says which of the chunk's tensor names the rule
        selects; ``scale(names)``, if given, a factor per name that each value is multiplied by
        before ``bad`` judges it; ``cache_key`` names the (selection, key, bad, scale) question
        for reuse."""
        found = self._summaries.get(cache_key)
        if found is None:
            found = self._summaries[cache_key] = self._summary(selected, key, bad, scale)
        distinct, bad_rows = found
        i = self._position.get(step)
        return i is not None and int(distinct[i]) == count and not bad_rows[i]

    def _summary(self, selected, key, bad, scale=None) -> Tuple[np.ndarray, np.ndarray]:
        in_selection = np.r_[np.asarray(selected(self.names), bool), False]
        if key is None:
            wanted = np.asarray([k is not None for k in self.keys], bool)
        else:
            wanted = np.asarray([k == key for k in self.keys], bool)
        keep = in_selection[self.tensor] & wanted[self.label]
        position = np.searchsorted(self.steps, self.step[keep])
        tensor = self.tensor[keep]
        firsts = np.r_[True, (position[1:] != position[:-1]) | (tensor[1:] != tensor[:-1])] if len(tensor) else \
            np.zeros(0, bool)
        distinct = np.bincount(position[firsts], minlength=len(self.steps))
        values = self.value[keep]
        if scale is not None:
            values = values * np.r_[np.asarray(scale(self.names), np.float64), np.nan][tensor]
        bad_rows = np.bincount(position, weights=bad(values).astype(np.float64), minlength=len(self.steps)) > 0
        return distinct, bad_rows


class StepRows:
    """One step's rows of a chunk, turned into Python objects tensor by tensor on first use."""

    __slots__ = ("_chunk", "_lo", "_hi", "_done", "saved", "values")

    def __init__(self, chunk: ChunkColumns, lo: int, hi: int):
        self._chunk, self._lo, self._hi = chunk, lo, hi
        self._done: set = set()
        self.saved = LazyRows(self)
        self.values = LazyRows(self)

    def load(self, name) -> None:
        """Put ``name``'s rows into ``saved`` (reductions) and ``values`` (a one-element value),
        unless something was stored there for it already (a later read wins, as before)."""
        if name in self._done:
            return
        self._done.add(name)
        if not isinstance(name, str):
            return
        chunk = self._chunk
        start, stop = chunk.tensor_rows(self._lo, self._hi, name)
        if start == stop:
            return
        keys = chunk.keys
        reductions: dict = {}
        scalar = None
        for label, value in zip(chunk.label[start:stop].tolist(), chunk.value[start:stop].tolist()):
            key = keys[label]
            if key == "":
                scalar = value
            elif key is not None:
                reductions[key] = value
        if scalar is not None and not dict.__contains__(self.values, name):
            dict.__setitem__(self.values, name, np.asarray(scalar))
        if reductions and not dict.__contains__(self.saved, name):
            dict.__setitem__(self.saved, name, reductions)


class LazyRows(dict):
    """A dict of a step's tensors whose entries from the chunk appear when first asked for."""

    __slots__ = ("_rows",)

    def __init__(self, rows: StepRows):
        super().__init__()
        self._rows = rows

    def get(self, name, default=None):
        self._rows.load(name)
        return dict.get(self, name, default)

    def __contains__(self, name) -> bool:
        self._rows.load(name)
        return dict.__contains__(self, name)

    def __getitem__(self, name):
        self._rows.load(name)
        return dict.__getitem__(self, name)

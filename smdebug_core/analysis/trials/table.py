"""The long table ``Trial.to_table`` returns (:class:`Table`): numbers as numpy arrays, texts
as category codes, made into a pandas DataFrame by ``to_pandas``."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ...modes import ModeKeys
from .steps import step_positions

#: Columns of the long table, in order.
COLUMNS = ("step", "mode", "mode_step", "worker", "tensor", "reduction", "value")
_MAX_MODE_NUMBER = max(m.value for m in ModeKeys)


def require_optional(module: str, what: str, install: str, extra: str):
    """``module`` imported, or ImportError saying what needs it and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module.split('.')[0]}, which is not installed: pip install {install} "
                          f"(smdebug-core's '{extra}' extra)") from None


def require_pandas(what: str):
    """The pandas module, or ImportError saying how to install it."""
    return require_optional("pandas", what, "pandas", "analysis")


def _used_ids(codes: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``codes`` (ids below ``size``), sorted."""
    return np.flatnonzero(np.bincount(codes, minlength=size)) if len(codes) else np.zeros(0, np.int64)


def sorted_codes(codes: np.ndarray, items: List[str]) -> Tuple[np.ndarray, List[str]]:
    """Codes into ``items`` recoded into the sorted list of the items they use."""
    used = _used_ids(codes, len(items)).tolist()
    categories = sorted(items[i] for i in used)
    lookup = np.zeros(len(items), _code_dtype(len(categories)))
    rank = {c: k for k, c in enumerate(categories)}
    for i in used:
        lookup[i] = rank[items[i]]
    return lookup[codes], categories


def _compact(codes: np.ndarray, categories: List[str]):
    """Codes and categories with the categories no row uses dropped (order kept)."""
    used = _used_ids(codes, len(categories))
    if len(used) == len(categories):
        return codes, categories
    lookup = np.zeros(len(categories), _code_dtype(len(used)))
    lookup[used] = np.arange(len(used))
    return lookup[codes], [categories[i] for i in used.tolist()]


def _code_dtype(categories: int):
    """The smallest signed integer type for codes into that many categories (pandas's own
    choice for categoricals: no conversion when the DataFrame is made)."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories < np.iinfo(dtype).max:
            return dtype
    return np.int64


def _own_numbering(conflicts, numbers: dict, texts: dict) -> None:
    """Give the rows of workers that number a step differently from the trial (see
    ``Trial.worker_step_conflicts``) their own mode and mode step, in place."""
    steps = numbers["step"]
    rows = np.flatnonzero(np.isin(steps, np.fromiter(conflicts, np.int64, len(conflicts))))
    if not len(rows):
        return
    worker_codes, workers = texts["worker"]
    mode_codes, modes = texts["mode"]
    mode_codes, modes, mode_steps = mode_codes.astype(np.int64), list(modes), numbers["mode_step"].copy()
    for i in rows.tolist():
        own = conflicts[int(steps[i])].get(workers[worker_codes[i]])
        if own is not None:
            if own[0].name not in modes:
                modes.append(own[0].name)
            mode_codes[i], mode_steps[i] = modes.index(own[0].name), own[1]
    numbers["mode_step"] = mode_steps
    texts["mode"] = (mode_codes, modes)


class Table:
    """The long table in columns: numbers as numpy arrays, texts as category codes.

    ``step`` (global), ``mode`` (name), ``mode_step``, ``worker``, ``tensor``, ``reduction``
    (``""`` for a scalar's own value), ``value`` (float64); rows sorted by tensor,
    reduction, worker, step. :meth:`to_pandas` makes the DataFrame; without pandas,
    :meth:`rows` gives the rows as tuples.
    """

    TEXT = ("mode", "worker", "tensor", "reduction")

    def __init__(self, numbers: Dict[str, np.ndarray], texts: Dict[str, tuple]):
        self.numbers = numbers
        self.texts = texts  # column -> (codes, categories)

    def __len__(self):
        return len(self.numbers["value"])

    def __repr__(self):
        steps = self.numbers["step"]
        span = f", steps {int(steps.min())}..{int(steps.max())}" if len(steps) else ""
        tensors, workers = (len(np.unique(self.texts[name][0])) for name in ("tensor", "worker"))
        return (f"<Table: {len(self)} rows of {tensors} tensors, {workers} workers{span}; "
                f"columns {', '.join(COLUMNS)}; .to_pandas() or .rows()>")

    @classmethod
    def empty(cls):
        zeros = np.zeros(0, np.int64)
        return cls({"step": zeros, "mode_step": zeros, "value": np.zeros(0)},
                   {name: (zeros, []) for name in cls.TEXT})

    @classmethod
    def build(cls, keep, steps, texts, values, step_table, conflicts):
        """The rows marked in ``keep``; ``texts``: column -> (codes per row, categories);
        ``step_table``: ``StepIndex.arrays()``; ``conflicts``: ``StepIndex.worker_step_conflicts``."""
        if not keep.any():
            return cls.empty()
        every = keep.all()
        if not every:
            steps, values = steps[keep], values[keep]
        known, mode_of, mode_step_of = step_table
        at = step_positions(known, steps)
        # Modes: per loaded step first (few), then per row once the rows are sorted.
        step_used = np.zeros(len(known), bool)
        step_used[at] = True
        present = _used_ids(mode_of[step_used], _MAX_MODE_NUMBER + 1)
        mode_codes = np.zeros(_MAX_MODE_NUMBER + 1, np.int8)
        mode_codes[present] = np.arange(len(present))
        mode_code_of_step = mode_codes[mode_of]
        texts = {k: _compact(codes if every else codes[keep], cats) for k, (codes, cats) in texts.items()}
        (t, t_cats), (r, r_cats), (w, w_cats) = texts["tensor"], texts["reduction"], texts["worker"]
        # Sorted by tensor, reduction, worker, step: one integer key when it fits in 63 bits
        # (a step's rank among the loaded steps stands for the step).
        if len(t_cats) * len(r_cats) * len(w_cats) * len(known) < 1 << 62:
            key = t.astype(np.int64)
            for codes, size in ((r, len(r_cats)), (w, len(w_cats))):
                key *= size
                key += codes
            key *= len(known)
            key += at
            order = np.argsort(key, kind="stable")
            del key
        else:
            order = np.lexsort((steps, w, r, t))
        at = at[order]
        numbers = {"step": known[at], "mode_step": mode_step_of[at], "value": values[order]}
        texts = {k: (codes[order], cats) for k, (codes, cats) in texts.items()}
        texts["mode"] = (mode_code_of_step[at], [ModeKeys(int(v)).name for v in present])
        if conflicts:
            _own_numbering(conflicts, numbers, texts)
        return cls(numbers, texts)

    @classmethod
    def concat(cls, first: "Table", second: "Table") -> "Table":
        """The rows of both tables, sorted as one table's are."""
        if not len(second):
            return first
        if not len(first):
            return second
        texts = {}
        for name in cls.TEXT:
            (a, a_cats), (b, b_cats) = first.texts[name], second.texts[name]
            cats = sorted(set(a_cats) | set(b_cats),
                          key=(lambda m: ModeKeys[m].value) if name == "mode" else None)
            rank = {c: k for k, c in enumerate(cats)}
            dtype = _code_dtype(len(cats))
            a_map = np.asarray([rank[c] for c in a_cats], dtype)
            b_map = np.asarray([rank[c] for c in b_cats], dtype)
            texts[name] = (np.concatenate([a_map[a], b_map[b]]), cats)
        numbers = {k: np.concatenate([first.numbers[k], second.numbers[k]]) for k in first.numbers}
        order = np.lexsort((numbers["step"], texts["worker"][0], texts["reduction"][0], texts["tensor"][0]))
        return cls({k: v[order] for k, v in numbers.items()}, {k: (c[order], cats) for k, (c, cats) in texts.items()})

    def column(self, name: str):
        """One column: a numpy array of numbers, or a list of texts."""
        if name in self.numbers:
            return self.numbers[name]
        codes, categories = self.texts[name]
        return [categories[c] for c in codes.tolist()]

    def rows(self):
        """The rows as tuples, in :data:`COLUMNS` order."""
        return zip(*(self.column(name) if name in self.texts else self.numbers[name].tolist() for name in COLUMNS))

    def series(self) -> Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rows by (tensor, reduction label): global steps, values and mode names, one
        value per step (the first worker's; rows come worker after worker)."""
        out: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if not len(self):
            return out
        t_codes, t_cats = self.texts["tensor"]
        r_codes, r_cats = self.texts["reduction"]
        m_codes, m_cats = self.texts["mode"]
        steps, values = self.numbers["step"], self.numbers["value"]
        key = t_codes.astype(np.int64) * (len(r_cats) + 1) + r_codes
        bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
        modes = np.asarray(m_cats, dtype=object)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            order = np.argsort(steps[a:b], kind="stable")
            s = steps[a:b][order]
            pick = order[np.r_[True, s[1:] != s[:-1]]]
            out[(t_cats[t_codes[a]], r_cats[r_codes[a]])] = (
                steps[a:b][pick], values[a:b][pick], modes[m_codes[a:b][pick]])
        return out

    def to_pandas(self):
        """The table as a pandas DataFrame (texts as categoricals)."""
        pd = require_pandas("Trial.to_dataframe")
        # copy=False: the columns become the frame's as they are (the table's arrays are its
        # own), not stacked into 2-D blocks by dtype (a copy: 0.3 s for ten million rows).
        return pd.DataFrame(self.encoded(COLUMNS, lambda codes, categories: pd.Categorical.from_codes(
            codes, categories=categories)), copy=False)

    def encoded(self, columns, text) -> dict:
        """``columns`` by name: numbers as they are, texts made by ``text(codes, categories)``."""
        return {name: self.numbers[name] if name in self.numbers else text(*self.texts[name]) for name in columns}

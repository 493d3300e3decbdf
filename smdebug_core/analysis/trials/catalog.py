"""What each tensor of a run saved, in one public object: ``trial.catalog()``.

    catalog = trial.catalog()
    entry = catalog["gradient/Net_fc1.weight"]
    entry.kinds               # ("value", "reductions", "shape"): what it saved, at some step
    entry.reductions          # ("l2", "abs_max"): its saved reductions, in the order saved
    entry.saved[smd.modes.TRAIN].interval   # saved every so many TRAIN steps
    entry.workers, entry.order              # who saved it; its place in the model order
    catalog.order.sorted(names)             # names in model order (order.py)

Made from the record log's columns of either layout (the index files' RecordLog, the run
store's StoreLog) with numpy: no Python per saved value. It covers every step the trial has
loaded, complete or not, and is made again after a refresh that read something new.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ...modes import ModeKeys
from .order import ModelOrder, production_ranks

VALUE, REDUCTIONS, SHAPE = "value", "reductions", "shape"
#: Cells (tensors x step span) up to which distinct (tensor, step) pairs are found with a bitmap.
_BITMAP_CELLS = 1 << 25


@dataclass(frozen=True)
class SavedSteps:
    """The steps of one mode at which a tensor saved anything, in that mode's own numbering."""

    count: int
    first: int
    last: int
    interval: int  # the median gap between saved steps; 0 when saved once
    regular: bool  # every gap equals ``interval``


@dataclass(frozen=True)
class TensorEntry:
    """What one tensor saved (see the module docstring). Immutable."""

    name: str
    kinds: Tuple[str, ...]
    reductions: Tuple[str, ...]
    workers: Tuple[str, ...]
    saved: Mapping[ModeKeys, SavedSteps] = field(hash=False)
    num_steps: int
    first_step: int  # global steps; -1 when unknown
    last_step: int
    order: int  # the tensor's place in the run's model order (0: first)

    @property
    def has_value(self) -> bool:
        """Whether it saved its value (whole) at some step, not only reductions or a shape."""
        return VALUE in self.kinds

    @property
    def has_reductions(self) -> bool:
        return REDUCTIONS in self.kinds

    @property
    def modes(self) -> List[ModeKeys]:
        return list(self.saved)

    def interval(self, mode) -> Optional[int]:
        """The save interval in ``mode``'s steps (0: saved once; None: not saved in it)."""
        found = self.saved.get(ModeKeys.parse(mode))
        return None if found is None else found.interval


class Catalog(Mapping):
    """``name -> TensorEntry`` of every tensor of a run (sorted by name when iterated), with the
    run's :class:`~.order.ModelOrder` (``order``) and workers. Get it with ``trial.catalog()``."""

    def __init__(self, entries: Dict[str, TensorEntry], order: ModelOrder, workers: Sequence[str], columns,
                 log_items: Tuple[list, list, list], extra_steps: Mapping[str, np.ndarray]):
        self._entries = MappingProxyType(dict(sorted(entries.items())))
        self.order = order
        self.workers: Tuple[str, ...] = tuple(workers)
        self._columns = columns
        self._items = log_items  # the columns' tensor, worker and label names by id
        self._tensor_ids = {n: i for i, n in enumerate(log_items[0])}
        self._worker_ids = {n: i for i, n in enumerate(log_items[1])}
        self._extra_steps = extra_steps  # steps of shape-only saves (not in the record log)

    def __getitem__(self, name: str) -> TensorEntry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self):
        return f"<Catalog: {len(self)} tensors, workers {', '.join(self.workers) or 'none'}>"

    def names(self, kind: Optional[str] = None) -> List[str]:
        """The names (sorted) of the tensors that saved ``kind`` (``"value"``, ``"reductions"``,
        ``"shape"``) at some step; every name without it."""
        return [n for n, e in self._entries.items() if kind is None or kind in e.kinds]

    def in_model_order(self, names: Optional[Iterable[str]] = None) -> List[str]:
        """``names`` (default: every tensor) in the run's model order (``order.key``)."""
        return self.order.sorted(self._entries if names is None else names)

    def records(self, names: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """Every record of ``names`` (default: all) the run holds, a row each, in columns:
        ``step`` (global, int64), ``worker``, ``tensor`` and ``reduction`` (``""``: the value;
        object arrays). Shapes are not records."""
        cols = self._columns
        keep = self._keep(names)
        tensors, workers, labels = (np.asarray(items + [""], object) for items in self._items)
        return {"step": cols["step"][keep], "worker": workers[cols["worker"][keep]],
                "tensor": tensors[cols["tensor"][keep]], "reduction": labels[cols["label"][keep]]}

    def _keep(self, names, workers=None):
        cols = self._columns
        keep = np.ones(len(cols["step"]), bool)
        if names is not None:
            ids = [self._tensor_ids[n] for n in names if n in self._tensor_ids]
            keep &= np.isin(cols["tensor"], np.asarray(ids, np.int64))
        if workers is not None:
            ids = [self._worker_ids[w] for w in workers if w in self._worker_ids]
            keep &= np.isin(cols["worker"], np.asarray(ids, np.int64))
        return keep

    def steps_saved(self, names: Optional[Iterable[str]] = None, workers: Optional[Iterable[str]] = None
                    ) -> np.ndarray:
        """The sorted global steps at which any of ``names`` (default: all) was saved by any of
        ``workers`` (default: all), from the columns."""
        names = None if names is None else list(names)
        found = _distinct(self._columns["step"][self._keep(names, workers)])
        extra = [self._extra_steps[n] for n in (self._extra_steps if names is None else names)
                 if n in self._extra_steps]
        if extra and workers is None:
            found = np.union1d(found, np.concatenate(extra))
        return found


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (runs of equal values dropped first: the log's rows come in blocks)."""
    if len(values) > 1:
        values = values[np.r_[True, values[1:] != values[:-1]]]
    return np.unique(values)


def _saved_steps(mode_steps: np.ndarray) -> SavedSteps:
    gaps = np.diff(mode_steps)
    interval = int(np.median(gaps)) if len(gaps) else 0
    return SavedSteps(len(mode_steps), int(mode_steps[0]), int(mode_steps[-1]), interval,
                      bool(len(gaps) == 0 or (gaps == interval).all()))


def _tensor_steps(tensor: np.ndarray, step: np.ndarray, count: int) -> List[np.ndarray]:
    """Each tensor id's sorted distinct steps."""
    if not len(step):
        return [np.zeros(0, np.int64) for _ in range(count)]
    lo, hi = int(step.min()), int(step.max())
    span = hi - lo + 1
    key = tensor.astype(np.int64) * span + (step - lo)
    if len(key) > 1:
        key = key[np.r_[True, key[1:] != key[:-1]]]
    if count * span <= _BITMAP_CELLS:
        seen = np.zeros(count * span, bool)
        seen[key] = True
        key = np.flatnonzero(seen)
    else:
        key = np.unique(key)
    bounds = np.searchsorted(key, np.arange(count + 1, dtype=np.int64) * span)
    return [key[bounds[i]:bounds[i + 1]] - i * span + lo for i in range(count)]


def build_catalog(log, steps_index, workers: Sequence[str], shapes: Mapping[str, np.ndarray],
                  names: Iterable[str]) -> Catalog:
    """The catalog of a trial: ``log`` its record log (RecordLog or StoreLog), ``steps_index``
    its StepIndex, ``workers`` its workers, ``shapes`` ``name -> global steps`` of the saved
    shapes, ``names`` every tensor name the trial knows."""
    cols = log.arrays()
    tensor_items, label_items, worker_items = list(log.tensors.items), list(log.labels.items), \
        list(log.workers.items)
    t_count, l_count, w_count = len(tensor_items), max(len(label_items), 1), max(len(worker_items), 1)
    # Ids as they come (int32: no copies of ten million rows); a pair's code fits int64.
    tensor, label, worker, step = (cols.get(k, np.zeros(0, np.int64)) for k in ("tensor", "label", "worker", "step"))
    wide = np.int64 if t_count * max(l_count, w_count) >= 2 ** 31 else np.int32
    labels_of = np.bincount(tensor.astype(wide, copy=False) * wide(l_count) + label,
                            minlength=t_count * l_count).reshape(t_count, l_count) > 0
    workers_of = np.bincount(tensor.astype(wide, copy=False) * wide(w_count) + worker,
                             minlength=t_count * w_count).reshape(t_count, w_count) > 0
    by_tensor = _tensor_steps(tensor, step, t_count)
    known, modes, mode_steps = steps_index.arrays()
    produced, pair_ranks = production_ranks(cols, dict(enumerate(tensor_items)))
    order = ModelOrder(produced)
    everything: Set[str] = set(names) | set(tensor_items) | set(shapes)
    ranks = {n: i for i, n in enumerate(order.sorted(everything))}
    by_mode_number = {m.value: m for m in ModeKeys}
    entries: Dict[str, TensorEntry] = {}
    ids = {n: i for i, n in enumerate(tensor_items)}
    for name in everything:
        i = ids.get(name)
        kinds: List[str] = []
        reductions: Tuple[str, ...] = ()
        own_workers: Tuple[str, ...] = ()
        steps = by_tensor[i] if i is not None else np.zeros(0, np.int64)
        if i is not None:
            if labels_of[i, 0]:
                kinds.append(VALUE)
            saved = [j for j in np.flatnonzero(labels_of[i]).tolist() if j]
            if saved:
                kinds.append(REDUCTIONS)
                reductions = tuple(label_items[j] for j in sorted(
                    saved, key=lambda j: (pair_ranks.get((i, j), len(pair_ranks)), label_items[j])))
            own_workers = tuple(sorted(worker_items[w] for w in np.flatnonzero(workers_of[i]).tolist()))
        if name in shapes:
            kinds.append(SHAPE)
            steps = np.union1d(steps, shapes[name])
        at = np.clip(np.searchsorted(known, steps), 0, max(len(known) - 1, 0))
        registered = known[at] == steps if len(known) else np.zeros(len(steps), bool)
        at = at[registered]
        per_mode: Dict[ModeKeys, SavedSteps] = {}
        step_modes = modes[at]
        for number in np.unique(step_modes).tolist():
            own = mode_steps[at[step_modes == number]]
            if len(own) > 1 and not (own[1:] > own[:-1]).all():  # a restarted job saved a mode step twice
                own = np.unique(own)
            per_mode[by_mode_number[number]] = _saved_steps(own)
        per_mode = dict(sorted(per_mode.items(), key=lambda item: item[0].value))
        entries[name] = TensorEntry(
            name, tuple(kinds), reductions, own_workers, MappingProxyType(per_mode), len(steps),
            int(steps[0]) if len(steps) else -1, int(steps[-1]) if len(steps) else -1, ranks[name])
    cols = {k: cols.get(k, np.zeros(0, np.int64)) for k in ("step", "worker", "tensor", "label")}
    return Catalog(entries, order, workers, cols, (tensor_items, worker_items, label_items),
                   MappingProxyType(dict(shapes)))

"""What the trial asks a run store's index for, made from its columns when asked: a tensor's
records step by step (:class:`LazyRecords`, :class:`StepMap`), the tensors by name
(:class:`Catalog`), the names of a step or mode, and the rows in a RecordLog's columns
(:class:`StoreLog`). Used by store_index.py."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX
from ...storage.format.store import KIND_SHAPE
from ...reduction_config import reduction_label
from .locations import InlineValue, TensorRecords

if TYPE_CHECKING:
    from .store_segments import Part

#: What these views read: the trial's StoreIndex (store_index.py), which builds them; named
#: here without importing it (it imports this module).
StoreIndex = "StoreIndex"

class Catalog(Mapping):
    """``name -> TensorRecords`` of every tensor with rows; a tensor's records are built when
    first asked for, and kept up to date as segments are read."""

    def __init__(self, index: StoreIndex):
        self._index = index
        self._built: Dict[str, TensorRecords] = {}

    def __contains__(self, name) -> bool:
        return name in self._index.present_names()

    def __getitem__(self, name: str) -> TensorRecords:
        records = self._built.get(name)
        if records is None:
            if name not in self._index.present_names():
                raise KeyError(name)
            records = self._built[name] = LazyRecords(self._index, name)
        return records

    def get(self, name, default=None):
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._index.present_names())

    def __len__(self) -> int:
        return len(self._index.present_names())

    def keys(self):
        return self._index.present_names().keys()

    def update(self, parts: List[Part]) -> None:
        """Segments were read or grew: the records handed out take their rows."""
        for records in self._built.values():
            records.rebuild()


#: Steps whose entries a :class:`StepMap` keeps made (they are made again when asked for).
_STEP_CACHE = 4096


class LazyRecords(TensorRecords):
    """A tensor's :class:`TensorRecords` over the store's columns: ``locations``,
    ``reductions`` and ``step_workers`` are :class:`StepMap` s that make a step's entries
    when it is asked for (a run of 10,000 steps and 5 reductions would otherwise make 50,000
    objects per tensor up front); shapes and placements (from the ``tensors`` table, few)
    are plain dicts. Rebuilt in place when segments are read (``Tensor`` keeps the maps)."""

    def __init__(self, index: StoreIndex, name: str):
        super().__init__()
        self._index = index
        self.name = name
        self._eager = TensorRecords()  # the tensors table's rows: whole values, shapes, placements
        self.shapes = self._eager.shapes
        self.placements = self._eager.placements
        self.locations = StepMap(self, "value")
        self.reductions = StepMap(self, "reduction")
        self.step_workers = StepMap(self, "workers")
        self.rebuild()

    def rebuild(self) -> None:
        """Take the rows of the segments read since (each segment's share is kept by its
        version: a refresh that read one live segment redoes that one only)."""
        index, eager = self._index, self._eager
        tensor_id = index.names.ids.get(self.name)
        parts = index.ordered_parts()
        shares = self.__dict__.setdefault("_shares", {})  # (folder, number) -> (version, share)
        rows_changed = False
        sources, value_steps, reduction_steps = [], [], []
        for part in parts:
            key = (part.folder, part.number)
            known = shares.get(key)
            if known is None or known[0] != part.version:
                part.load()
                share = None
                if tensor_id is not None and len(part):
                    rows = part.rows_of(tensor_id)
                    if len(rows):
                        steps = part.step[rows]
                        if len(steps) > 1 and not (steps[1:] >= steps[:-1]).all():
                            order = np.argsort(steps, kind="stable")  # later rows stay later
                            rows, steps = rows[order], steps[order]
                        own = part.label[rows] == 0
                        share = ((part, rows, steps), steps[own], steps[~own])
                had_rows = known is not None and known[2]
                has_rows = bool(index.tensor_rows_of(part, self.name))
                rows_changed = rows_changed or had_rows or has_rows
                known = shares[key] = (part.version, share, has_rows)
            if known[1] is not None:
                sources.append(known[1][0])
                value_steps.append(known[1][1])
                reduction_steps.append(known[1][2])
        if rows_changed or not self.__dict__.get("_eager_done"):
            self._eager_done = True
            for d in (eager.locations, eager.reductions, eager.shapes, eager.placements, eager.step_workers):
                d.clear()
            eager._sorted_steps = None
            for part in parts:
                for row in index.tensor_rows_of(part, self.name):
                    index._add_tensor_row(eager, part.worker, row, index.tensor_row_name(row[3])[1], part)
        self._sources = sources

        def steps_of(pieces, extra):
            found = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
            if len(found) > 1 and not (found[1:] > found[:-1]).all():  # segments in order: usually sorted
                found = np.unique(found)
            if extra:
                found = np.union1d(found, np.fromiter(extra, np.int64, len(extra)))
            return found

        value = steps_of(value_steps, eager.locations)
        reduction = steps_of(reduction_steps, eager.reductions)
        every = np.union1d(np.union1d(value, reduction), np.fromiter(eager.step_workers, np.int64,
                                                                     len(eager.step_workers)))
        self.locations.reset(value)
        self.reductions.reset(reduction)
        self.step_workers.reset(every)
        self._sorted_steps = every.tolist()

    def global_steps(self) -> List[int]:
        return self._sorted_steps

    def entries(self, step: int, kind: str):
        """What the map of ``kind`` holds at ``step`` (see :class:`StepMap`)."""
        index = self._index
        keys, dtypes, labels = index._label_keys, index.dtypes.items, index.labels.items
        out: dict = {}
        workers: Set[str] = set()
        for part, rows, steps in self._sources:
            if steps[0] > step or steps[-1] < step:
                continue
            a, b = np.searchsorted(steps, step, "left"), np.searchsorted(steps, step, "right")
            if a == b:
                continue
            worker = part.worker
            if kind == "workers":
                workers.add(worker)
                continue
            at = rows[a:b]
            for label, value, dtype, ndim in zip(part.label[at].tolist(), part.value[at].tolist(),
                                                 part.dtype[at].tolist(), part.ndim[at].tolist()):
                if (label == 0) != (kind == "value"):
                    continue
                if label == 0:
                    out[worker] = InlineValue(value, dtypes[dtype], ndim, self.name)
                else:
                    tag = f"{REDUCTION_TAG_PREFIX}{labels[label]}/{self.name}"
                    out.setdefault(worker, {})[keys[label]] = InlineValue(value, dtypes[dtype], ndim, tag)
        eager = self._eager
        if kind == "workers":
            workers.update(eager.step_workers.get(step, ()))
            return workers
        if kind == "value":
            out.update(eager.locations.get(step, {}))
        else:
            for worker, by_key in eager.reductions.get(step, {}).items():
                out.setdefault(worker, {}).update(by_key)
        return out


class StepMap(Mapping):
    """``step -> entries`` of one tensor (``value``: ``{worker: location}``; ``reduction``:
    ``{worker: {key: location}}``; ``workers``: the set of workers with anything), made when
    a step is asked for, the last few thousand kept."""

    def __init__(self, records: LazyRecords, kind: str):
        self._records = records
        self._kind = kind
        self.reset(np.zeros(0, np.int64))

    def reset(self, steps: np.ndarray) -> None:
        # The list and the set are made when first used: many tensors are asked about a few steps.
        self._array = steps
        self._list: Optional[List[int]] = None
        self._set: Optional[Set[int]] = None
        self._made: Dict[int, object] = {}

    @property
    def _steps(self) -> List[int]:
        if self._list is None:
            self._list = self._array.tolist()
        return self._list

    @property
    def _known(self) -> Set[int]:
        if self._set is None:
            self._set = set(self._steps)
        return self._set

    def get(self, step, default=None):
        found = self._made.get(step)
        if found is None:
            if step not in self._known:
                return default
            if len(self._made) >= _STEP_CACHE:
                self._made.clear()
            found = self._made[step] = self._records.entries(step, self._kind)
        return found

    def __getitem__(self, step):
        found = self.get(step)
        if found is None:
            raise KeyError(step)
        return found

    def __contains__(self, step) -> bool:
        return step in self._known

    def __iter__(self):
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._array)

    def __bool__(self) -> bool:
        return len(self._array) > 0

    def keys(self):
        return list(self._steps)

    def values(self):
        return (self[s] for s in self._steps)

    def items(self):
        return ((s, self[s]) for s in self._steps)


class _NamesBy:
    """``key -> names saved there``, computed when asked for and cached: the names of the
    numbers' ids :meth:`_ids` finds in a part, and of the whole tensors :meth:`_row_matches`
    (a subclass may answer :meth:`get` its own way, as :class:`StepNames` does)."""

    def __init__(self, index: StoreIndex):
        self._index = index
        self._cache: Dict[object, Set[str]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def get(self, key, default=None):
        found = self._cache.get(key)
        if found is None:
            index = self._index
            ids: Set[int] = set()
            names: Set[str] = set()
            for part in index.loaded_parts():
                if not self._in(part, key):
                    continue
                if len(part):
                    ids.update(self._ids(part, key))
                names.update(index.tensor_row_name(r[3])[0] for r in part.tensor_rows if self._row_matches(r, key))
            names.update(index.names.items[i] for i in ids)
            if not names:
                return default
            found = self._cache[key] = names
        return found

    def _in(self, part: Part, key) -> bool:
        return True


class StepNames(_NamesBy):
    """``step -> names saved at it`` (``tensors_for_step``). Steps that hold the same tensors
    share one set, made once: a run's steps mostly do (the rules ask at every step)."""

    def __init__(self, index: StoreIndex):
        super().__init__(index)
        self._shared: Dict[tuple, Set[str]] = {}
        self._row_names: Dict[int, Dict[int, Tuple[str, ...]]] = {}  # id(part) -> step -> whole tensors

    def clear(self) -> None:
        super().clear()
        self._shared.clear()
        self._row_names.clear()

    def get(self, key, default=None):
        found = self._cache.get(key)
        if found is not None:
            return found
        index = self._index
        parts = [part for part in index.loaded_parts() if self._in(part, key)]
        signature = tuple((tuple(self._ids(part, key)) if len(part) else (), self._rows_at(part, key))
                          for part in parts)
        found = self._shared.get(signature)
        if found is None:
            items = index.names.items
            found = {items[i] for ids, _ in signature for i in ids}
            found.update(name for _, rows in signature for name in rows)
            if not found:
                return default
            self._shared[signature] = found
        self._cache[key] = found
        return found

    def _rows_at(self, part: Part, step: int) -> Tuple[str, ...]:
        """The names of a segment's whole tensors at ``step`` (indexed once per segment)."""
        by_step = self._row_names.get(id(part))
        if by_step is None or by_step.get(-1) is not part.tensor_rows:
            by_step = {}
            for row in part.tensor_rows:
                by_step.setdefault(row[0], []).append(self._index.tensor_row_name(row[3])[0])
            by_step = {s: tuple(names) for s, names in by_step.items()}
            by_step[-1] = part.tensor_rows  # what it was made from: made again when the segment grows
            self._row_names[id(part)] = by_step
        return by_step.get(step, ())

    def _in(self, part: Part, step: int) -> bool:
        return part.lo is not None and part.lo <= step <= part.hi

    def _ids(self, part: Part, step: int):
        return self._index.tensor_ids_at(part, step)


class ModeNames(_NamesBy):
    """``mode -> names saved in it`` (``tensors_for_mode``)."""

    def _ids(self, part: Part, mode: ModeKeys):
        return part.present(mode.value).tolist()

    @staticmethod
    def _row_matches(row, mode: ModeKeys) -> bool:
        return row[1] == mode.value


class StoreLog:
    """The store's rows in the columns of :meth:`~.record_log.RecordLog.arrays` (``step``,
    ``worker``, ``tensor``, ``label``, ``start``: a row's place in its segment, the order it
    was written in, whole tensors before numbers) with the same interners (``tensors``,
    ``workers``, ``labels``)."""

    def __init__(self, index: StoreIndex):
        self.tensors = index.names
        self.workers = index.workers
        self.labels = index.labels
        self._index = index
        self._columns: Optional[Dict[str, np.ndarray]] = None

    def arrays(self) -> Dict[str, np.ndarray]:
        if self._columns is None:
            pieces = {k: [] for k in ("step", "worker", "tensor", "label", "start")}
            index = self._index
            for part in index.loaded_parts():
                n = len(part)
                rows = [r for r in part.tensor_rows if r[4] != KIND_SHAPE]  # a shape is no record
                pieces["step"] += [part.step, np.asarray([r[0] for r in rows], np.int64)]
                pieces["worker"].append(np.full(n + len(rows), part.worker_id, np.int32))
                pieces["tensor"] += [part.tensor, np.asarray(
                    [self.tensors.id(index.tensor_row_name(r[3])[0]) for r in rows], np.int32)]
                pieces["label"] += [part.label, np.asarray(
                    [0 if k is None else self.labels.id(reduction_label(*k))
                     for k in (index.tensor_row_name(r[3])[1] for r in rows)], np.int32)]
                # The store keeps each table's rows in the order written, not how the two
                # interleave within a step: a step's whole tensors are taken as written first.
                pieces["start"].append(np.r_[np.arange(len(rows), len(rows) + n), np.arange(len(rows))].astype(np.int64))
            self._columns = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in pieces.items()}
        return dict(self._columns)

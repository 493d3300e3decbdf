"""The records a trial's index files name, in columns (:class:`RecordLog`): filled while
the index is loaded, read by the bulk reader with numpy masks."""
from __future__ import annotations

from array import array
from itertools import chain
from typing import Dict, List, Tuple

import numpy as np

from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag
from ...reduction_config import reduction_label


class _Interner:
    """Texts numbered in order of first sight."""

    def __init__(self, first=()):
        self.ids: Dict[object, int] = {}
        self.items: list = []
        for item in first:
            self.id(item)

    def id(self, item) -> int:
        found = self.ids.get(item)
        if found is None:
            found = self.ids[item] = len(self.items)
            self.items.append(item)
        return found

    def ids_of(self, items) -> List[int]:
        ids, new = self.ids, self.id
        return [ids[x] if x in ids else new(x) for x in items]


class RecordLog:
    """Every record the trial's index files name, in columns: filled while the index is
    loaded (a few tuple operations per index file), read by ``bulk.collect`` with numpy masks
    instead of walking per-tensor dicts record by record. Rows are only ever added.

    Per index file it keeps the step, worker, event file, the file's *template* (its list
    of record names: runs save the same records step after step, so the per-name work, the
    tensor and reduction each name stands for, is done once per distinct list) and its
    *layout* (its records' offsets and lengths, likewise shared by most files of a run);
    per record only the payload CRC.
    """

    def __init__(self):
        self.workers = _Interner()
        self.tensors = _Interner()
        self.labels = _Interner([""])  # label 0: a tensor's own value
        self.files = _Interner()
        self.names = _Interner()
        self._file_columns = {k: array("q") for k in ("step", "worker", "file", "template", "layout", "count")}
        # Each index file's payload CRCs (a tuple), turned into a column at the next
        # arrays() call: one C loop over all of them.
        self._pending_crcs: List[tuple] = []
        self._converted_files = 0  # files whose records arrays() has turned into columns
        self._columns: Dict[str, np.ndarray] = {}
        self._templates: Dict[Tuple[str, ...], int] = {}
        self._template_ids: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # tensor, label, name ids
        self._layouts: Dict[Tuple[tuple, tuple], int] = {}  # (offsets, lengths) -> layout id
        # Set when one index file names a (tensor, reduction) twice: the last one counts, as
        # for value(); collect() then drops the earlier rows.
        self.has_repeats = False

    def add(self, step: int, worker: str, locations: list) -> None:
        """The records of one index file (TensorLocations, all in one event file)."""
        n = len(locations)
        if not n:
            return
        event_file, starts, lengths, crcs, names = zip(*locations)  # one C call: the fields as tuples
        template = self._templates.get(names)
        if template is None:
            template = self._templates[names] = len(self._template_ids)
            self._template_ids.append(self._template(names))
        key = (starts, lengths)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = len(self._layouts)
        f = self._file_columns
        f["step"].append(step)
        f["worker"].append(self.workers.id(worker))
        f["file"].append(self.files.id(event_file[0]))
        f["template"].append(template)
        f["layout"].append(layout)
        f["count"].append(n)
        self._pending_crcs.append(crcs)

    def file_info(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per event file id: the template and layout of the index file that names it, and
        its number of records (-1 where several index files name the same event file)."""
        f = {k: np.array(self._file_columns[k], np.int64) for k in ("file", "template", "layout", "count")}
        n = len(self.files.items)
        template = np.zeros(n, np.int64)
        layout = np.zeros(n, np.int64)
        records = np.full(n, -1, np.int64)
        template[f["file"]] = f["template"]
        layout[f["file"]] = f["layout"]
        records[f["file"]] = f["count"]
        named = np.bincount(f["file"], minlength=n)
        records[named > 1] = -1
        return template, layout, records

    def _template(self, names: Tuple[str, ...]):
        tensors, labels = [], []
        for name in names:
            reduction = parse_reduction_tag(name) if REDUCTION_TAG_PREFIX in name else None
            if reduction is None:
                tensors.append(name)
                labels.append("")
            else:
                op, is_abs, tensor = reduction
                tensors.append(tensor)
                labels.append(reduction_label(op, is_abs))
        tensor_ids = self.tensors.ids_of(tensors)
        label_ids = self.labels.ids_of(labels)
        if len(set(zip(tensor_ids, label_ids))) < len(names):
            self.has_repeats = True
        return (np.asarray(tensor_ids, np.int64), np.asarray(label_ids, np.int64),
                np.asarray(self.names.ids_of(names), np.int64))

    def arrays(self) -> Dict[str, np.ndarray]:
        """One array per column, a row per record: ``step``, ``worker``, ``file``,
        ``tensor``, ``label``, ``name`` (int32 ids into the interners), ``start``,
        ``length``, ``crc`` (-1: none). The caller may keep them: later records make new
        arrays."""
        pending, self._pending_crcs = self._pending_crcs, []
        if pending or not self._columns:
            n = sum(map(len, pending))
            try:
                crc = np.fromiter(chain.from_iterable(pending), np.int64, n)
            except TypeError:  # runs of other writers may have none: -1
                crc = np.array([-1 if c is None else c for c in chain.from_iterable(pending)], np.int64)
            f = {k: np.array(v, np.int64) for k, v in self._file_columns.items()}
            done = self._converted_files
            self._converted_files = len(f["count"])
            layouts = list(self._layouts)
            per_record = _PerRecord(f["layout"][done:], f["count"][done:],
                                    max((len(key[0]) for key in layouts), default=0), len(layouts))
            new = {"crc": crc}
            for column, part in (("start", 0), ("length", 1)):
                new[column] = per_record.column([key[part] for key in layouts])
            for column, values in new.items():
                old = self._columns.get(column)
                self._columns[column] = values if old is None else np.concatenate((old, values))
            # Per-file columns and templates: rebuilt whole (a few passes over the files, in C).
            # Ids as int32 (half the memory to fill; interners stay far below 2^31 entries).
            self._columns["step"] = np.repeat(f["step"], f["count"])
            for column in ("worker", "file"):
                self._columns[column] = np.repeat(f[column].astype(np.int32), f["count"])
            per_record = _PerRecord(f["template"], f["count"], max((len(ids[0]) for ids in self._template_ids),
                                                                   default=0), len(self._template_ids))
            for j, column in enumerate(("tensor", "label", "name")):
                self._columns[column] = per_record.column([ids[j] for ids in self._template_ids], np.int32)
        return dict(self._columns)


class _PerRecord:
    """Columns made of one of a few int sequences per file: file k contributes
    ``sequences[which[k]]`` (``counts[k]`` long). Few distinct sequences (the usual case):
    one gather from a padded table, the gather's index computed once for all columns; when
    padding would cost more than the column itself, joined one by one."""

    def __init__(self, which: np.ndarray, counts: np.ndarray, width: int, distinct: int):
        self.which, self.counts = which, counts
        total = int(counts.sum())
        self.width = width
        self.index = None
        if distinct * width <= 2 * total + 4096:
            index = np.repeat(which * width - (np.cumsum(counts) - counts), counts)
            index += np.arange(total)
            self.index = index

    def column(self, sequences, dtype=np.int64) -> np.ndarray:
        if self.index is None:
            arrays = [np.asarray(seq, dtype) for seq in sequences]
            parts = [arrays[i] for i in self.which.tolist()]
            return np.concatenate(parts) if parts else np.zeros(0, dtype)
        table = np.zeros((len(sequences), self.width), dtype)
        for i, seq in enumerate(sequences):
            table[i, :len(seq)] = seq
        return table.reshape(-1).take(self.index)

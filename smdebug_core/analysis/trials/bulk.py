"""Reading many scalar records at once: the engine behind ``Trial.to_table`` and ``to_dataframe``.

``Tensor.value()`` decodes one record with the protobuf classes, a few microseconds of
Python per value. A run of 10,000 steps with 25 scalars and reductions holds 250,000 such
records, so this module reads them in bulk instead:

1. the records to read are selected from the trial's ``RecordLog`` (record_log.py: the
   index files' entries in columns, kept as they are loaded) with numpy masks, grouped by
   event file (:func:`collect`);
2. files whose wanted records have the same layout as many others (the usual case: runs
   save the same records step after step) are read side by side and checked against one
   model file (layouts.py);
3. the other files, and the files those checks refuse, are opened once each through the
   trial's storage (the checks of docs/reader_safety.md: regular files only, links leaving
   the run refused, reads bounded by the file's size), and all their records are parsed
   together with numpy, field by field (record_walk.py), which accepts only the exact
   layout of a one-tensor ``Event`` (docs/format.md 2.2, 2.3): framing and length CRC, the
   index's payload CRC32C, the tag the index names, a numeric dtype, one element, mode/mode
   step metadata of digits;
4. every record the walk does not accept (a dtype marker, typed value lists, a damaged
   record...) is decoded one by one by the same code as ``Tensor.value()``
   (``RecordReader.decode``), which either returns the value or raises the error
   ``value()`` would raise.

So each row equals ``tensor.value(...).item()`` or ``reduction_value(...)`` of its step,
and a damaged record costs its row (one warning for all of them), not the table.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import google_crc32c
import numpy as np

from ...exceptions import CorruptRecord, MissingEventFile
from ...storage.format import wire
from .event_reads import RecordReader
from .layouts import read_layouts
from .locations import ReadRequest, TensorLocation
from .progress import progress_bar, progress_wanted
from .record_log import RecordLog
from .record_walk import FAST_DTYPES, PAD, scalar_of, tags_match, values_of, walk_records
from .steps import StepIndex, step_positions
from .table import Table, sorted_codes

logger = logging.getLogger("smdebug.trials")

#: A raw record longer than this (plus 8 bytes per character of its name) cannot hold one
#: element (it would need dozens of unit dimensions): it is not read at all.
_SCALAR_RECORD_MAX = 1024
#: Read a file's wanted records with one read when the bytes in between add at most this.
_COALESCE_SLACK = 1 << 16
_PROGRESS_MIN_FILES = 500


class Rows:
    """The records to read, in columns (numpy int64 arrays): ``step``, ``start``, ``length``,
    ``crc`` (-1: none), ``file`` and ``name`` (ids into ``files`` and ``names``), and per text
    column (``tensor``, ``worker``, ``reduction``) codes into sorted categories."""

    def __init__(self, columns: Dict[str, np.ndarray], files: List[str], names: List[str],
                 texts: Dict[str, Tuple[np.ndarray, List[str]]]):
        self.columns = columns
        self.files = files
        self.names = names
        self.texts = texts
        self.file_info = None  # RecordLog.file_info(), for grouping files by layout

    def __len__(self):
        return len(self.columns["step"])

    def subset(self, idx: np.ndarray) -> "Rows":
        """The rows ``idx`` only."""
        return Rows({k: v[idx] for k, v in self.columns.items()}, self.files, self.names,
                     {k: (codes[idx], cats) for k, (codes, cats) in self.texts.items()})

    def location(self, i: int) -> TensorLocation:
        """Row ``i`` as the TensorLocation ``value()`` reads."""
        c = self.columns
        crc = int(c["crc"][i])
        return TensorLocation(self.files[int(c["file"][i])], int(c["start"][i]), int(c["length"][i]),
                              None if crc < 0 else crc, self.names[int(c["name"][i])])


def _last_of_repeats(c: Dict[str, np.ndarray]) -> np.ndarray:
    """Rows to keep when a (step, worker, tensor, label) appears more than once: the last."""
    n = len(c["step"])
    order = np.lexsort((np.arange(n), c["label"], c["tensor"], c["worker"], c["step"]))
    same_as_next = np.ones(n, bool)
    same_as_next[-1] = False
    for column in ("step", "worker", "tensor", "label"):
        v = c[column][order]
        same_as_next[:-1] &= v[1:] == v[:-1]
    return np.sort(order[~same_as_next])


def collect(log: RecordLog, index: StepIndex, names: List[str], modes, steps, workers,
            include_incomplete: bool, labels: Optional[List[str]] = None) -> Rows:
    """Every saved reduction (those named in ``labels`` only, when given), and every raw
    record small enough to be a scalar, of the tensors called ``names`` at the selected
    steps (see ``Trial.to_table``)."""
    c = log.arrays()
    if log.has_repeats:
        keep_rows = _last_of_repeats(c)
        c = {k: v[keep_rows] for k, v in c.items()}
    keep = np.zeros(len(log.tensors.items), bool)
    # Raw values: only records small enough to hold one element are read.
    limit = np.zeros(len(keep), np.int64)
    for name in names:
        i = log.tensors.ids.get(name)
        if i is not None:
            keep[i] = True
            limit[i] = _SCALAR_RECORD_MAX + 8 * len(name.encode("utf-8"))
    t = c["tensor"]
    mask = keep[t] & ((c["label"] != 0) | (c["length"] <= limit[t]))
    if workers is not None:
        wanted = np.asarray([w in workers for w in log.workers.items], bool)
        mask &= wanted[c["worker"]]
    if labels is not None:
        wanted = np.asarray([i == 0 or label in labels for i, label in enumerate(log.labels.items)], bool)
        mask &= wanted[c["label"]]
    if modes is not None or steps is not None:
        known, mode_of, mode_step_of = index.arrays()
        at = step_positions(known, c["step"])
        if modes is not None:
            mask &= np.isin(mode_of[at], np.asarray(sorted(m.value for m in modes)))
        if steps is not None:
            numbers = c["step"] if modes is None else mode_step_of[at]
            mask &= np.isin(numbers, np.asarray(sorted(steps), np.int64))
    if not include_incomplete and not index.loaded_all_steps:
        late = mask & (c["step"] > index.last_complete_step)
        if late.any():
            late_steps = np.unique(c["step"][late])
            done = late_steps[np.fromiter(map(index.is_complete, late_steps.tolist()), bool, len(late_steps))]
            mask &= ~late | np.isin(c["step"], done)
    if not mask.all():
        c = {k: v[mask] for k, v in c.items()}
    texts = {"tensor": sorted_codes(c["tensor"], log.tensors.items),
             "worker": sorted_codes(c["worker"], log.workers.items),
             "reduction": sorted_codes(c["label"], log.labels.items)}
    rows = Rows(c, log.files.items, log.names.items, texts)
    rows.file_info = log.file_info()
    return rows


class FilePlan:
    """The rows grouped by event file: ``order`` sorts them by (file, offset); file ``k``'s
    rows are ``order[first[k]:first[k] + count[k]]``, its wanted bytes ``lo[k]:hi[k]``, read
    with one read when ``coalesce[k]`` (else record by record)."""

    def __init__(self, c: Dict[str, np.ndarray]):
        start, length, file_key = c["start"], c["length"], c["file"]
        n = len(start)
        # Rows come file after file, in each file's order: usually sorted already.
        same_file = file_key[1:] == file_key[:-1]
        if n < 2 or ((file_key[1:] > file_key[:-1]) | (same_file & (start[1:] > start[:-1]))).all():
            self.order = order = np.arange(n)
            self.in_order = True
        else:
            self.order = order = np.lexsort((start, file_key))
            self.in_order = False
        s_key = file_key[order]
        self.first = first = np.flatnonzero(np.r_[True, s_key[1:] != s_key[:-1]])
        self.count = np.diff(np.r_[first, n])
        s_start = start[order]
        s_end = s_start + length[order]
        self.lo = s_start[first]
        self.hi = np.maximum.reduceat(s_end, first)
        needed = np.add.reduceat(s_end - s_start, first)
        self.coalesce = (self.hi - self.lo) <= needed + _COALESCE_SLACK
        self.file_of_sorted = np.repeat(np.arange(len(first)), self.count)

    def sorted(self, column: np.ndarray) -> np.ndarray:
        """``column`` in the plan's order (the column itself when rows are in order)."""
        return column if self.in_order else column[self.order]


def read_rows(rows: Rows, reader: RecordReader, index: StepIndex, stats: Dict[str, int],
              progress: Optional[bool], on_error: str = "warn") -> Table:
    """Read the values of ``rows`` (from :func:`collect`) into a :class:`Table`, through the
    trial's ``reader``; ``stats``: the trial's counters; ``progress``: the trial's choice.

    Files whose wanted records have the layout of many others are checked and decoded
    together (:func:`.layouts.read_layouts`); the other rows, and rows those checks do not
    accept, go through :func:`_read_general`, which reports what is wrong with them.
    """
    n = len(rows)
    if not n:
        return Table.empty()
    c = rows.columns
    step_table = index.arrays()
    plan = FilePlan(c)
    nfiles = len(plan.first)
    wanted = nfiles >= _PROGRESS_MIN_FILES and progress_wanted(progress)
    bar = progress_bar(wanted, nfiles, "reading event files")
    values = np.full(n, np.nan)
    keep = np.zeros(n, bool)
    errors: List[str] = []
    try:
        done = read_layouts(reader.storage, reader.check, stats, rows, plan, step_table, values, keep, bar)
        rest = np.flatnonzero(~done)
        lost = 0
        if len(rest):
            sub_values, sub_keep, lost = _read_general(reader, stats, rows.subset(rest), step_table, bar, on_error,
                                                       errors)
            values[rest] = sub_values
            keep[rest] = sub_keep
    finally:
        if bar is not None:
            bar.close()
    if errors:
        logger.warning("smdebug: %d record(s) could not be read and are left out of the table (%d error(s)); "
                       "the first: %s", lost, len(errors), errors[0])
    return Table.build(keep, c["step"], rows.texts, values, step_table, index.worker_step_conflicts)


def _read_general(reader: RecordReader, stats: Dict[str, int], rows: Rows, step_table, bar, on_error: str,
                  errors: List[str]):
    """Read the values of ``rows`` record by record: ``(values, keep, lost)``. Errors are
    appended to ``errors`` (or raised, with ``on_error="raise"``)."""
    n = len(rows)
    c = rows.columns
    start, length, g_all = c["start"], c["length"], c["step"]
    texts = rows.texts
    worker_codes = texts["worker"][0]
    plan = FilePlan(c)
    order, first, lo, hi, coalesce = plan.order, plan.first, plan.lo, plan.hi, plan.coalesce
    firsts = first.tolist()
    bounds = firsts[1:] + [n]
    order_list = order.tolist()
    base = np.zeros(n, np.int64)  # where each record's first byte is in the joined buffer
    avail = np.zeros(n, np.int64)  # where the bytes read for it end
    nfiles = len(firsts)
    file_start = np.zeros(nfiles, np.int64)  # where a coalesced span is in the joined buffer
    file_end = np.zeros(nfiles, np.int64)
    failed = np.zeros(n, bool)
    chunks: List[bytes] = []
    cursor = 0
    storage = reader.storage
    tensor_names = texts["tensor"][1]
    tensor_codes = texts["tensor"][0]
    # Each event file once, through the storage's checked reads: the span of its wanted
    # records, or each record when they lie far apart.
    spans = []
    owners = []  # per span: the file's index k, and the row for a one-record span (else -1)
    files = rows.files
    file_of_first = c["file"][order[first]].tolist()
    for k, (a, b, f_lo, f_hi, together, f) in enumerate(zip(firsts, bounds, lo.tolist(), hi.tolist(),
                                                           coalesce.tolist(), file_of_first)):
        if together:
            spans.append((files[f], f_lo, f_hi - f_lo))
            owners.append((k, -1))
        else:
            for i in order_list[a:b]:
                spans.append((files[f], int(start[i]), int(length[i])))
                owners.append((k, i))
    datas: List[object] = []
    step_size = 512 if bar is not None else len(spans)
    for at in range(0, len(spans), max(1, step_size)):
        datas += storage.read_spans(spans[at:at + step_size])
        if bar is not None:
            bar.update(len({k for k, _ in owners[at:at + step_size]}))
    for (k, i), span, data in zip(owners, spans, datas):
        if not isinstance(data, bytes):
            row = i if i >= 0 else order_list[firsts[k]]
            try:
                if isinstance(data, FileNotFoundError):  # not there yet? wait as value() does
                    data = reader.read(span[0], [span[1:]], int(g_all[row]), tensor_names[tensor_codes[row]])[0]
                else:
                    raise CorruptRecord(f"event file {span[0]} of step {int(g_all[row])}: {data}")
            except (CorruptRecord, MissingEventFile) as exc:
                failed[order[firsts[k]:bounds[k]] if i < 0 else i] = True
                errors.append(str(exc))
                if on_error == "raise":
                    raise
                data = b""
        if i < 0:
            file_start[k] = cursor
            cursor += len(data)
            file_end[k] = cursor
        else:
            base[i] = cursor
            cursor += len(data)
            avail[i] = cursor
        chunks.append(data)
    # Places of the records of coalesced spans, all at once.
    file_of_sorted = plan.file_of_sorted
    dense = coalesce[file_of_sorted]
    rows_dense = order[dense]
    fk = file_of_sorted[dense]
    base[rows_dense] = file_start[fk] + (start[rows_dense] - lo[fk])
    avail[rows_dense] = file_end[fk]
    chunks.append(bytes(PAD))  # zeros after the last record: word reads stay in bounds
    joined = b"".join(chunks)
    del chunks
    u = np.frombuffer(joined, np.uint8)

    # The metadata each record should have, from the index's mode and mode step of its step.
    known, mode_of, mode_step_of = step_table
    used, which = np.unique(np.searchsorted(known, g_all), return_inverse=True)
    texts_md = list(map(wire.metadata_field, mode_of[used].tolist(), mode_step_of[used].tolist()))
    w, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe = walk_records(
        u, base, length, avail, reader.check, (texts_md, which.reshape(-1)))
    ok = w.ok & ~failed
    # The name each record must carry (the index's).
    used_names, name_ids = np.unique(c["name"], return_inverse=True)
    ok &= tags_match(w, tag_start, tag_stop - tag_start, name_ids.reshape(-1),
                      [rows.names[i].encode("utf-8") for i in used_names.tolist()])
    itemsize = np.zeros(256, np.int64)
    for code, np_dtype in FAST_DTYPES.items():
        itemsize[code] = np_dtype.itemsize
    size = itemsize[np.where(ok, dtype, 0) & 0xFF]
    ok &= size > 0
    c_len = c_stop - c_start
    scalar = ok & unit & (c_len == size)
    # A well-formed tensor of several elements is no scalar: left out without decoding.
    several = ok & (c_len > size) & (c_len % np.maximum(size, 1) == 0)
    # Payload CRC32C from the index, where it has one (writers of this project): one C
    # call per record.
    verify = np.flatnonzero(scalar & (c["crc"] >= 0))  # runs of other writers may have none
    if len(verify):
        expected = c["crc"][verify]
        got = np.fromiter(map(google_crc32c.value, map(joined.__getitem__,
                                                      map(slice, p[verify].tolist(), pe[verify].tolist()))),
                          np.int64, len(verify))
        scalar[verify[got != expected]] = False  # damaged: the slow path says how
    values = np.full(n, np.nan)
    keep = scalar.copy()
    fast = np.flatnonzero(scalar)
    values[fast] = values_of(w, dtype, c_start, fast)

    # Everything else, one record at a time, as Tensor.value() reads it.
    slow = np.flatnonzero(~scalar & ~several & ~failed)
    lost = int(failed.sum())  # values lost with their event file
    stats["table_records_bulk"] = stats.get("table_records_bulk", 0) + len(fast)
    stats["table_records_one_by_one"] = stats.get("table_records_one_by_one", 0) + len(slow)
    if len(slow):
        worker_names = texts["worker"][1]
        view = memoryview(joined)
        for i in slow.tolist():
            location = rows.location(i)
            stop = min(int(base[i]) + location.length, int(avail[i]))
            try:
                value = reader.decode(view[int(base[i]):stop],
                                      ReadRequest(None, location, int(g_all[i]), worker_names[worker_codes[i]]))
            except CorruptRecord as exc:
                errors.append(str(exc))
                lost += 1
                if on_error == "raise":
                    raise
                continue
            number = scalar_of(value)
            if number is not None:
                values[i] = number
                keep[i] = True
    return values, keep, lost

"""Reading many scalar records at once: the engine behind ``Trial.to_dataframe``.

``Tensor.value()`` decodes one record with the protobuf classes, a few microseconds of
Python per value. A run of 10,000 steps with 25 scalars and reductions holds 250,000 such
records, so this module reads them in bulk instead:

1. the records to read are listed from the trial's index (no event file is listed or
   scanned), grouped by event file;
2. each event file is opened once through the trial's storage (the checks of
   docs/reader_safety.md: regular files only, links leaving the run refused, reads
   bounded by the file's size) and the byte span holding its wanted records is read;
3. all records of all files are parsed together with numpy, field by field, as
   arrays of positions into one buffer (:func:`_walk`). The walk accepts only the exact
   layout of a one-tensor ``Event`` (docs/format.md 2.2, 2.3): framing and length CRC,
   the index's payload CRC32C, the tag the index names, a numeric dtype, one element,
   mode/mode step metadata of digits;
4. every record the walk does not accept (a dtype marker, typed value lists, a damaged
   record...) is decoded one by one by the same code as ``Tensor.value()``, which either
   returns the value or raises the error ``value()`` would raise.

So each row equals ``float(tensor.value(...))`` or ``reduction_value(...)`` of its step,
and a damaged record costs its row (one warning for all of them), not the table.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Sequence, Tuple

import google_crc32c
import numpy as np

from ..exceptions import CorruptRecord, MissingEventFile, UnsafeRunFile
from ..format import proto
from ..format.codec import decode_tensor_event
from ..format.layout import END_OF_JOB_FILE
from ..format.records import SMDEBUG_PAYLOAD_FOOTER, read_record, record_header, verify_payload_crc
from ..modes import ModeKeys

logger = logging.getLogger("smdebug.trials")

GLOBAL = ModeKeys.GLOBAL
#: Columns of the long table, in order.
COLUMNS = ("step", "mode", "mode_step", "worker", "tensor", "reduction", "value")
#: A raw record longer than this (plus 8 bytes per character of its name) cannot hold one
#: element (it would need dozens of unit dimensions): it is not read at all.
_SCALAR_RECORD_MAX = 1024
#: Read a file's wanted records with one read when the bytes in between add at most this.
_COALESCE_SLACK = 1 << 16
_PROGRESS_MIN_FILES = 500
_MISSING_EVENT_POLL_S = 0.1
# Wire types of real numbers that come back from tensor_content as they are.
_FAST_DTYPES = {
    proto.DT_FLOAT: np.dtype("<f4"), proto.DT_DOUBLE: np.dtype("<f8"), proto.DT_INT32: np.dtype("<i4"),
    proto.DT_UINT8: np.dtype("u1"), proto.DT_INT16: np.dtype("<i2"), proto.DT_INT8: np.dtype("i1"),
    proto.DT_INT64: np.dtype("<i8"), proto.DT_BOOL: np.dtype("?"), proto.DT_UINT16: np.dtype("<u2"),
    proto.DT_HALF: np.dtype("<f2"), proto.DT_UINT32: np.dtype("<u4"), proto.DT_UINT64: np.dtype("<u8"),
}
_PAD = 32  # zero bytes after the buffer: gathers a few bytes past a record stay in bounds
_MODE_STEP = np.frombuffer(b"mode_step", np.uint8)
_MODE = np.frombuffer(b"mode", np.uint8)
_MAX_DIMS = 8
_MAX_PLUGIN_ENTRIES = 3


def reduction_label(op: str, is_abs: bool) -> str:
    """The ``reduction`` column's text for a reduction key: ``l2``, ``abs_max``..."""
    return f"abs_{op}" if is_abs else op


# ---------------------------------------------------------------- the vectorized walk


class _Walk:
    """Positions of every record in one buffer ``u``, parsed in lockstep; ``ok`` says which
    records still follow the expected layout. Positions are clamped into the buffer, so a
    record that went wrong only produces nonsense for itself, which ``ok`` then excludes.
    Checks take an optional ``where`` mask: records outside it are not checked (a field
    that is optional and absent there)."""

    def __init__(self, u: np.ndarray, ok: np.ndarray):
        self.u = u
        self.ok = ok
        self.limit = len(u) - _PAD

    def clamp(self, pos):
        return np.minimum(np.maximum(pos, 0), self.limit)

    def require(self, cond, where=None):
        if where is None:
            self.ok &= cond
        else:
            self.ok &= cond | ~where

    def varint(self, pos, where=None):
        """``(value, position after it)``; a varint longer than 9 bytes fails its record."""
        u = self.u
        b = u[pos]
        value = (b & 0x7F).astype(np.int64)
        after = pos + 1
        more = np.flatnonzero(b >= 0x80)
        if len(more):
            q = pos[more]
            v = value[more]
            n = np.ones(len(more), np.int64)
            going = np.ones(len(more), bool)
            for k in range(1, 9):
                byte = u[q + k].astype(np.int64)
                v = np.where(going, v | ((byte & 0x7F) << (7 * k)), v)
                n += going
                going &= byte >= 0x80
                if not going.any():
                    break
            if going.any():  # 10 bytes: negative or beyond an int64
                bad = np.zeros(len(pos), bool)
                bad[more[going]] = True
                self.require(~bad, where)
            value[more] = v
            after[more] = q + n
        return value, self.clamp(after)

    def field(self, pos, key, end, where=None):
        """A length-delimited field with ``key`` at ``pos``: ``(start, stop)`` of its bytes."""
        self.require(self.u[pos] == key, where)
        length, pos = self.varint(self.clamp(pos + 1), where)
        stop = pos + np.minimum(length, self.limit)
        self.require(stop <= end, where)
        return pos, self.clamp(stop)

    def present(self, pos, key, end):
        return (self.u[pos] == key) & (pos < end)

    def equals(self, starts, lengths, pattern):
        """Per record: the ``lengths`` bytes at ``starts`` are ``pattern``."""
        same = lengths == len(pattern)
        idx = np.flatnonzero(same)
        if len(idx):
            got = self.u[starts[idx, None] + np.arange(len(pattern))]
            same[idx] = (got == pattern).all(axis=1)
        return same

    def digits(self, starts, lengths, max_len=19):
        """Per record: 1 to ``max_len`` ASCII digits at ``starts``."""
        good = (lengths >= 1) & (lengths <= max_len)
        span = np.arange(max_len)
        got = self.u[starts[:, None] + span]
        inside = span < lengths[:, None]
        return good & ((~inside) | ((got >= 0x30) & (got <= 0x39))).all(axis=1)


def _walk(u: np.ndarray, off: np.ndarray, length: np.ndarray, avail: np.ndarray, check: str):
    """Parse one-tensor records in bulk (docs/format.md 2.1-2.3).

    ``off``/``length``: each record's place in ``u``, as the index gives it; ``avail``: where
    the bytes read for it end. Returns ``(ok, dtype, unit, content_start, content_stop,
    tag_start, tag_stop, payload_start, payload_stop)``: ``ok`` marks records that have
    exactly the expected layout, ``unit`` those whose shape has only dimensions of size 1.
    """
    n = len(off)
    ok = (length >= 16) & (off + length <= avail)
    w = _Walk(u, ok)
    off = w.clamp(off)
    # Framing (docs/format.md 2.1): the header must be the one a payload of this length has,
    # which checks the length and its CRC in one comparison.
    lengths, inverse = np.unique(np.where(ok, length, 16), return_inverse=True)
    headers = np.frombuffer(b"".join(record_header(int(x) - 16) for x in lengths), np.uint8).reshape(-1, 12)
    width = 8 if check == "none" else 12
    got = u[off[:, None] + np.arange(width)]
    w.require((got == headers[inverse.reshape(-1), :width]).all(axis=1))
    p = w.clamp(off + 12)
    pe = w.clamp(off + length - 4)
    if check == "full":  # a real footer CRC takes the slow path, which checks it
        footer = np.ascontiguousarray(u[pe[:, None] + np.arange(4)]).view("<u4").reshape(-1)
        w.require(footer == SMDEBUG_PAYLOAD_FOOTER)

    # Event: wall_time (1, fixed64), step (2, varint), summary (5).
    pos = p + 9 * (u[p] == 0x09)
    has_step = w.present(pos, 0x10, pe)
    _, after = w.varint(w.clamp(pos + 1), has_step)
    pos = np.where(has_step, after, pos)
    pos, s_end = w.field(pos, 0x2A, pe)
    w.require(s_end == pe)
    # Summary: exactly one value.
    pos, v_end = w.field(pos, 0x0A, s_end)
    w.require(v_end == s_end)
    # Value: tag (1), tensor (8), metadata (9), nothing else.
    tag_start, tag_stop = w.field(pos, 0x0A, v_end)
    t_pos, t_end = w.field(tag_stop, 0x42, v_end)
    # TensorProto: dtype (1, one byte), tensor_shape (2, optional), tensor_content (4).
    w.require(u[t_pos] == 0x08)
    dtype = u[w.clamp(t_pos + 1)].astype(np.int64)
    w.require(dtype < 0x80)
    pos = w.clamp(t_pos + 2)
    has_shape = w.present(pos, 0x12, t_end)
    sh_pos, sh_end = w.field(pos, 0x12, t_end, has_shape)
    sh_pos = np.where(has_shape, sh_pos, pos)
    sh_end = np.where(has_shape, sh_end, pos)
    c_start, c_stop = w.field(sh_end, 0x22, t_end)
    w.require(c_stop == t_end)
    m_pos, m_end = w.field(t_end, 0x4A, v_end)
    w.require(m_end == v_end)

    # Shape: dimensions {size (1), name (2)}; `unit` when every size is 1.
    unit = np.ones(n, bool)
    pos = sh_pos
    for _ in range(_MAX_DIMS):
        active = w.ok & (pos < sh_end)
        if not active.any():
            break
        d_pos, d_end = w.field(pos, 0x12, sh_end, active)
        has_size = active & w.present(d_pos, 0x08, d_end)
        size, after = w.varint(w.clamp(d_pos + 1), has_size)
        unit &= ~active | (has_size & (size == 1))
        q = np.where(has_size, after, d_pos)
        has_name = active & w.present(q, 0x12, d_end)
        _, name_end = w.field(q, 0x12, d_end, has_name)
        q = np.where(has_name, name_end, q)
        w.require(q == d_end, active)
        pos = np.where(active, d_end, pos)
    w.require(pos >= sh_end)

    # Metadata: plugin entries ("mode_step", digits) and ("mode", one digit 1-4) only.
    pos = m_pos
    for _ in range(_MAX_PLUGIN_ENTRIES):
        active = w.ok & (pos < m_end)
        if not active.any():
            break
        e_pos, e_end = w.field(pos, 0x0A, m_end, active)
        n_pos, n_end = w.field(e_pos, 0x0A, e_end, active)
        x_pos, x_end = w.field(n_end, 0x12, e_end, active)
        name_len, text_len = n_end - n_pos, x_end - x_pos
        is_step = w.equals(n_pos, name_len, _MODE_STEP) & w.digits(x_pos, text_len)
        first = u[x_pos]
        is_mode = w.equals(n_pos, name_len, _MODE) & (text_len == 1) & (first >= 0x31) & (first <= 0x34)
        w.require((is_step | is_mode) & (x_end == e_end), active)
        pos = np.where(active, e_end, pos)
    w.require(pos >= m_end)
    return w.ok, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe


def _tags_match(u, tag_start, tag_len, name_ids, names):
    """Per record: its tag is the name the index gives (one comparison per distinct name)."""
    out = np.zeros(len(tag_start), bool)
    if not len(name_ids):
        return out
    order = np.argsort(name_ids, kind="stable")
    bounds = np.flatnonzero(np.diff(name_ids[order])) + 1
    for group in np.split(order, bounds):
        pattern = np.frombuffer(names[name_ids[group[0]]], np.uint8)
        idx = group[tag_len[group] == len(pattern)]
        if len(idx):
            got = u[tag_start[idx, None] + np.arange(len(pattern))]
            out[idx] = (got == pattern).all(axis=1)
    return out


def _values_of(u, dtype, c_start, idx):
    """float64 values of the one-element contents at ``c_start[idx]``, by wire dtype."""
    out = np.empty(len(idx), np.float64)
    codes = dtype[idx]
    for code in np.unique(codes):
        np_dtype = _FAST_DTYPES[int(code)]
        sub = np.flatnonzero(codes == code)
        raw = u[c_start[idx[sub], None] + np.arange(np_dtype.itemsize)]
        out[sub] = np.ascontiguousarray(raw).view(np_dtype).reshape(-1).astype(np.float64)
    return out


def _scalar_of(value: np.ndarray) -> Optional[float]:
    """A decoded value as one float, or None when it is not one real number."""
    if value.size != 1 or value.dtype.kind not in "biufV":  # V: bfloat16 and the other ml_dtypes
        return None
    try:
        return float(value.reshape(-1)[0])
    except (TypeError, ValueError):
        return None


def collect(trial, tensors, modes, steps, workers, include_incomplete: bool) -> List[tuple]:
    """``(global step, worker, tensor name, reduction label, TensorLocation, is_raw)`` of every
    saved reduction and every raw record that may be a scalar, for the selection."""
    to_mode = trial._global_to_mode
    complete = trial._is_complete
    rows: List[tuple] = []
    append = rows.append
    for tensor in tensors:
        name = tensor.name
        limit = _SCALAR_RECORD_MAX + 8 * len(name.encode("utf-8"))
        labels: Dict[tuple, str] = {}
        for g in tensor._global_steps():
            mode, mode_step = to_mode[g]
            if modes is not None and mode not in modes:
                continue
            if steps is not None and (g if modes is None else mode_step) not in steps:
                continue
            if not include_incomplete and not complete(g):
                continue
            reds = tensor._reductions.get(g)
            if reds:
                for worker, by_key in reds.items():
                    if workers is not None and worker not in workers:
                        continue
                    for key, location in by_key.items():
                        label = labels.get(key)
                        if label is None:
                            label = labels[key] = reduction_label(*key)
                        append((g, worker, name, label, location))
            raws = tensor._locations.get(g)
            if raws:
                for worker, location in raws.items():
                    if (workers is None or worker in workers) and location.length <= limit:
                        append((g, worker, name, "", location))
    return rows


def read_rows(trial, rows: List[tuple], progress: Optional[bool], on_error: str = "warn") -> Dict[str, object]:
    """Read the values of ``rows`` (from :func:`collect`); returns the table's columns."""
    from .tensor import Tensor, _Request
    from .trial import _progress_bar, _progress_wanted

    n = len(rows)
    if not n:
        return Table.empty()
    g_col, w_col, t_col, r_col, locs = zip(*rows)
    files, starts, lengths, crcs, names = zip(*locs)
    start = np.fromiter(starts, np.int64, n)
    length = np.fromiter(lengths, np.int64, n)
    file_ids: Dict[str, int] = {}
    fid = np.fromiter((file_ids.setdefault(f, len(file_ids)) for f in files), np.int64, n)

    # Read each event file once: the span of its wanted records (or each record, when
    # they are far apart), through the storage's checked reads.
    order = np.lexsort((start, fid))
    s_fid, s_start, s_end = fid[order], start[order], start[order] + length[order]
    first = np.flatnonzero(np.r_[True, s_fid[1:] != s_fid[:-1]])
    lo = s_start[first]
    hi = np.maximum.reduceat(s_end, first)
    needed = np.add.reduceat(s_end - s_start, first)
    file_names = list(file_ids)
    chunks: List[bytes] = []
    base = np.zeros(n, np.int64)  # where each record's first byte is in the joined buffer
    avail = np.zeros(n, np.int64)  # where the bytes read for it end
    failed = np.zeros(n, bool)
    errors: List[str] = []
    storage = trial._storage
    cursor = 0
    bounds = list(first[1:]) + [n]
    wanted = len(first) >= _PROGRESS_MIN_FILES and _progress_wanted(trial.progress if progress is None else progress)
    bar = _progress_bar(wanted, len(first), "reading event files")
    try:
        for k, (a, b) in enumerate(zip(first.tolist(), bounds)):
            members = order[a:b]
            event_file = file_names[int(s_fid[a])]
            f_lo, f_hi = int(lo[k]), int(hi[k])
            coalesce = f_hi - f_lo <= int(needed[k]) + _COALESCE_SLACK
            ranges = [(f_lo, f_hi - f_lo)] if coalesce else list(zip(s_start[a:b].tolist(),
                                                                      (s_end[a:b] - s_start[a:b]).tolist()))
            try:
                datas = _read_ranges(trial, storage, event_file, ranges, int(g_col[members[0]]), t_col[members[0]])
            except (CorruptRecord, MissingEventFile) as exc:
                failed[members] = True
                errors.append(str(exc))
                if on_error == "raise":
                    raise
                continue
            if coalesce:
                data = datas[0]
                base[members] = cursor + (start[members] - f_lo)
                avail[members] = cursor + len(data)
                chunks.append(data)
                cursor += len(data)
            else:
                for member, data in zip(members.tolist(), datas):
                    base[member] = cursor
                    avail[member] = cursor + len(data)
                    chunks.append(data)
                    cursor += len(data)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    joined = b"".join(chunks)
    del chunks
    u = np.frombuffer(joined + bytes(_PAD), np.uint8)

    ok, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe = _walk(u, base, length, avail, trial._record_check)
    ok &= ~failed
    name_ids_map: Dict[str, int] = {}
    name_ids = np.fromiter((name_ids_map.setdefault(x, len(name_ids_map)) for x in names), np.int64, n)
    ok &= _tags_match(u, tag_start, tag_stop - tag_start, name_ids, [x.encode("utf-8") for x in name_ids_map])
    ok &= np.isin(dtype, list(_FAST_DTYPES))
    itemsize = np.zeros(128, np.int64)
    for code, np_dtype in _FAST_DTYPES.items():
        itemsize[code] = np_dtype.itemsize
    size = itemsize[np.where(ok, dtype, 0)]
    c_len = c_stop - c_start
    scalar = ok & unit & (c_len == size)
    # A well-formed tensor of several elements is no scalar: left out without decoding.
    several = ok & (size > 0) & (c_len > size) & (c_len % np.maximum(size, 1) == 0)
    # Payload CRC32C from the index, where it has one (writers of this project): the
    # records' bytes, one C call each.
    has_crc = np.fromiter((c is not None for c in crcs), bool, n)
    verify = np.flatnonzero(scalar & has_crc)
    if len(verify):
        expected = np.fromiter((crcs[i] for i in verify.tolist()), np.int64, len(verify))
        got = np.fromiter(map(google_crc32c.value, map(joined.__getitem__,
                                                      map(slice, p[verify].tolist(), pe[verify].tolist()))),
                          np.int64, len(verify))
        scalar[verify[got != expected]] = False  # damaged: the slow path says how
    values = np.full(n, np.nan)
    keep = scalar.copy()
    fast = np.flatnonzero(scalar)
    values[fast] = _values_of(u, dtype, c_start, fast)

    # Everything else, one record at a time, as Tensor.value() reads it.
    slow = np.flatnonzero(~scalar & ~several & ~failed)
    if len(slow):
        tensors = trial._tensors
        for i in slow.tolist():
            location = locs[i]
            if base[i] + location.length > avail[i]:
                data = memoryview(joined)[int(base[i]):int(avail[i])]
            else:
                data = memoryview(joined)[int(base[i]):int(base[i]) + location.length]
            tensor = tensors[t_col[i]]
            try:
                value = tensor._decode(data, _Request(None, location, g_col[i], w_col[i]))
            except CorruptRecord as exc:
                errors.append(str(exc))
                if on_error == "raise":
                    raise
                continue
            number = _scalar_of(value)
            if number is not None:
                values[i] = number
                keep[i] = True
    if errors:
        logger.warning("smdebug: %d value(s) could not be read and are left out of the table; the first: %s",
                       len(errors), errors[0])
    idx = np.flatnonzero(keep)
    return Table.build(trial, idx, g_col, w_col, t_col, r_col, values[idx])


def _read_ranges(trial, storage, event_file: str, ranges, step: int, tensor: str) -> List[bytes]:
    """Byte ranges of an event file, waiting (bounded) for one the index names but that is
    not there yet, as ``Tensor.value()`` does."""
    deadline = None
    while True:
        try:
            return storage.read_ranges(event_file, ranges)
        except FileNotFoundError:
            pass
        except (ValueError, UnsafeRunFile) as exc:  # a path or link leaving the run, a FIFO
            raise CorruptRecord(f"event file {event_file} of step {step}: {exc}") from None
        if deadline is None:
            deadline = time.monotonic() + trial.wait_timeout
        if storage.exists(END_OF_JOB_FILE) or time.monotonic() >= deadline:
            mode, _ = trial._global_to_mode.get(step, (GLOBAL, step))
            raise MissingEventFile(tensor, step, mode, storage.local_path(event_file))
        time.sleep(min(_MISSING_EVENT_POLL_S, max(0.0, deadline - time.monotonic())))


def _codes(column: Sequence[str], idx: np.ndarray):
    """``(codes, sorted categories)`` of the texts ``column[i]`` for ``i`` in ``idx``."""
    found: Dict[str, int] = {}
    raw = np.fromiter((found.setdefault(v, len(found)) for v in map(column.__getitem__, idx.tolist())),
                      np.int64, len(idx))
    categories = sorted(found)
    remap = np.empty(len(found), np.int64)
    for new, text in enumerate(categories):
        remap[found[text]] = new
    return remap[raw], categories


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

    @classmethod
    def empty(cls):
        zeros = np.zeros(0, np.int64)
        return cls({"step": zeros, "mode_step": zeros, "value": np.zeros(0)},
                   {name: (zeros, []) for name in cls.TEXT})

    @classmethod
    def build(cls, trial, idx, g_col, w_col, t_col, r_col, values):
        n = len(idx)
        if not n:
            return cls.empty()
        steps = np.fromiter(map(g_col.__getitem__, idx.tolist()), np.int64, n)
        # Mode and mode step by global step, looked up for all rows at once.
        known = np.fromiter(trial._global_to_mode, np.int64, len(trial._global_to_mode))
        pairs = list(trial._global_to_mode.values())
        mode_of = np.fromiter((m.value for m, _ in pairs), np.int64, len(pairs))
        mode_step_of = np.fromiter((s for _, s in pairs), np.int64, len(pairs))
        sorter = np.argsort(known)
        at = sorter[np.searchsorted(known, steps, sorter=sorter)]
        mode_numbers = mode_of[at]
        present = sorted(set(np.unique(mode_numbers).tolist()))
        mode_names = [ModeKeys(v).name for v in present]
        mode_codes = np.searchsorted(np.asarray(present), mode_numbers)
        texts = {"mode": (mode_codes, mode_names), "worker": _codes(w_col, idx), "tensor": _codes(t_col, idx),
                 "reduction": _codes(r_col, idx)}
        order = np.lexsort((steps, texts["worker"][0], texts["reduction"][0], texts["tensor"][0]))
        numbers = {"step": steps[order], "mode_step": mode_step_of[at][order], "value": np.asarray(values)[order]}
        texts = {k: (codes[order], cats) for k, (codes, cats) in texts.items()}
        return cls(numbers, texts)

    def column(self, name: str):
        """One column: a numpy array of numbers, or a list of texts."""
        if name in self.numbers:
            return self.numbers[name]
        codes, categories = self.texts[name]
        return [categories[c] for c in codes.tolist()]

    def rows(self):
        """The rows as tuples, in :data:`COLUMNS` order."""
        return zip(*(self.column(name) if name in self.texts else self.numbers[name].tolist() for name in COLUMNS))

    def to_pandas(self):
        """The table as a pandas DataFrame (texts as categoricals)."""
        pd = require_pandas("Trial.to_dataframe")
        data = {}
        for name in COLUMNS:
            if name in self.numbers:
                data[name] = self.numbers[name]
            else:
                codes, categories = self.texts[name]
                data[name] = pd.Categorical.from_codes(codes, categories=categories)
        return pd.DataFrame(data)


def require_pandas(what: str):
    """The pandas module, or ImportError saying how to install it."""
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{what} needs pandas, which is not installed: pip install 'smdebug-core[analysis]' "
                          "(or pip install pandas)") from None
    return pandas

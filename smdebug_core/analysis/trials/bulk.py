"""Reading many scalar records at once: the engine behind ``Trial.to_dataframe``.

``Tensor.value()`` decodes one record with the protobuf classes, a few microseconds of
Python per value. A run of 10,000 steps with 25 scalars and reductions holds 250,000 such
records, so this module reads them in bulk instead:

1. the records to read are selected from the trial's :class:`RecordLog` (the index files'
   entries in columns, kept as they are loaded) with numpy masks, grouped by event file;
2. files whose wanted records have the same layout as many others (the usual case: runs
   save the same records step after step) are read side by side, a row per file, into a
   few reused buffers, by another thread while the previous batch is checked
   (:func:`_read_layouts`). One file of each group, the model, is checked by :func:`_walk`
   (below); every other file must have the model's bytes except where records
   legitimately differ (wall time, step, value, mode step digits), and each run of
   adjacent records the CRC32C that the index's payload CRC32Cs imply (one CRC32C call
   per file and run: :func:`_runs_match_index_crcs`). The values are then read at the
   model's offsets;
3. the other files, and the files those checks refuse, are opened once each through the
   trial's storage (the checks of docs/reader_safety.md: regular files only, links leaving
   the run refused, reads bounded by the file's size), and all their records are parsed
   together with numpy, field by field, as arrays of positions into one buffer
   (:func:`_walk`). The walk accepts only the exact layout of a one-tensor ``Event``
   (docs/format.md 2.2, 2.3): framing and length CRC, the index's payload CRC32C, the tag
   the index names, a numeric dtype, one element, mode/mode step metadata of digits;
4. every record the walk does not accept (a dtype marker, typed value lists, a damaged
   record...) is decoded one by one by the same code as ``Tensor.value()``, which either
   returns the value or raises the error ``value()`` would raise.

So each row equals ``float(tensor.value(...))`` or ``reduction_value(...)`` of its step,
and a damaged record costs its row (one warning for all of them), not the table.
"""
from __future__ import annotations

import functools
import logging
import operator
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, repeat
from operator import itemgetter
from typing import Dict, List, Optional, Tuple

import google_crc32c
import numpy as np

from ...exceptions import CorruptRecord, MissingEventFile
from ...storage.format import proto
from ...storage.format.records import SMDEBUG_PAYLOAD_FOOTER, record_header
from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag

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
# Wire types of real numbers that come back from tensor_content as they are.
_FAST_DTYPES = {
    proto.DT_FLOAT: np.dtype("<f4"), proto.DT_DOUBLE: np.dtype("<f8"), proto.DT_INT32: np.dtype("<i4"),
    proto.DT_UINT8: np.dtype("u1"), proto.DT_INT16: np.dtype("<i2"), proto.DT_INT8: np.dtype("i1"),
    proto.DT_INT64: np.dtype("<i8"), proto.DT_BOOL: np.dtype("?"), proto.DT_UINT16: np.dtype("<u2"),
    proto.DT_HALF: np.dtype("<f2"), proto.DT_UINT32: np.dtype("<u4"), proto.DT_UINT64: np.dtype("<u8"),
}
_PAD = 32  # zero bytes after the buffer: gathers a few bytes past a record stay in bounds
_MODE_STEP = b"mode_step"
_MODE = b"mode"
#: Longer records are left to the one-by-one decoder (a scalar record is far shorter).
_FAST_MAX_RECORD = 1 << 16
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
        # The buffer as overlapping little-endian 8-byte words, one starting at every byte:
        # comparing 8 bytes costs one gather.
        self.words = np.ndarray((len(u) - 7,), "<u8", buffer=u, strides=(1,))

    def word_eq(self, starts, pattern: bytes):
        """Per record: the bytes at ``starts`` begin with ``pattern``."""
        same = np.ones(len(starts), bool)
        for k in range(0, len(pattern), 8):
            piece = pattern[k:k + 8]
            mask = (1 << (8 * len(piece))) - 1
            want = int.from_bytes(piece, "little")
            same &= (self.words[self.clamp(starts + k)] & np.uint64(mask)) == np.uint64(want)
        return same

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

    def equals(self, starts, lengths, pattern: bytes):
        """Per record: the ``lengths`` bytes at ``starts`` are ``pattern``."""
        return (lengths == len(pattern)) & self.word_eq(starts, pattern)

    def digits(self, starts, lengths):
        """Per record: 1 to 16 ASCII digits at ``starts`` (mode steps have at most 12)."""
        good = (lengths >= 1) & (lengths <= 16)
        for k in (0, 8):
            word = self.words[self.clamp(starts + k)]
            n = np.clip(lengths - k, 0, 8).astype(np.uint64)
            # Bytes past the end are taken as "0"; a byte b is a digit when its high nibble
            # is 3 and b + 6 keeps it 3 (0x30-0x39).
            mask = np.where(n == 8, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << (np.uint64(8) * n)) - np.uint64(1))
            word = (word & mask) | (np.uint64(0x3030303030303030) & ~mask)
            high = np.uint64(0xF0F0F0F0F0F0F0F0)
            good &= ((word & high) == np.uint64(0x3030303030303030)) & \
                (((word + np.uint64(0x0606060606060606)) & high) == np.uint64(0x3030303030303030))
        return good


def _plugin_entries(w: _Walk, pos, m_end) -> None:
    """Check SummaryMetadata bytes: only ("mode_step", digits) and ("mode", 1-4) entries."""
    for _ in range(_MAX_PLUGIN_ENTRIES):
        active = w.ok & (pos < m_end)
        if not active.any():
            break
        e_pos, e_end = w.field(pos, 0x0A, m_end, active)
        n_pos, n_end = w.field(e_pos, 0x0A, e_end, active)
        x_pos, x_end = w.field(n_end, 0x12, e_end, active)
        name_len, text_len = n_end - n_pos, x_end - x_pos
        is_step = w.equals(n_pos, name_len, _MODE_STEP) & w.digits(x_pos, text_len)
        first = w.u[x_pos]
        is_mode = w.equals(n_pos, name_len, _MODE) & (text_len == 1) & (first >= 0x31) & (first <= 0x34)
        w.require((is_step | is_mode) & (x_end == e_end), active)
        pos = np.where(active, e_end, pos)
    w.require(pos >= m_end)


@functools.lru_cache(maxsize=1 << 16)
def metadata_field(mode: int, mode_step: int) -> bytes:
    """``Summary.Value.metadata`` as this project's writers serialize it (docs/format.md 2.3),
    for a mode number (TRAIN 1 ...) and a mode step."""
    step_text = b"%d" % mode_step
    first = b"\x0a\x09mode_step\x12" + bytes((len(step_text),)) + step_text
    second = b"\x0a\x04mode\x12\x01" + b"%d" % mode
    body = b"\x0a" + bytes((len(first),)) + first + b"\x0a" + bytes((len(second),)) + second
    return b"\x4a" + bytes((len(body),)) + body


def _walk(u: np.ndarray, off: np.ndarray, length: np.ndarray, avail: np.ndarray, check: str,
          expected_metadata=None):
    """Parse one-tensor records in bulk (docs/format.md 2.1-2.3).

    ``off``/``length``: each record's place in ``u``, as the index gives it; ``avail``: where
    the bytes read for it end. Returns ``(ok, dtype, unit, content_start, content_stop,
    tag_start, tag_stop, payload_start, payload_stop)``: ``ok`` marks records that have
    exactly the expected layout, ``unit`` those whose shape has only dimensions of size 1.
    """
    n = len(off)
    ok = (length >= 16) & (length <= _FAST_MAX_RECORD) & (off + length <= avail)
    w = _Walk(u, ok)
    off = w.clamp(off)
    length = np.where(ok, length, 16)
    # Framing (docs/format.md 2.1): the header must be the one a payload of this length has,
    # which checks the length and its CRC in one comparison.
    seen = np.zeros(_FAST_MAX_RECORD + 1, bool)
    seen[length] = True
    head_len = np.zeros(_FAST_MAX_RECORD + 1, np.uint64)
    head_crc = np.zeros(_FAST_MAX_RECORD + 1, np.uint64)
    for x in np.flatnonzero(seen).tolist():
        header = record_header(x - 16)
        head_len[x] = int.from_bytes(header[:8], "little")
        head_crc[x] = int.from_bytes(header[8:], "little")
    w.require(w.words[off] == head_len[length])
    if check != "none":
        w.require((w.words[off + 8] & np.uint64(0xFFFFFFFF)) == head_crc[length])
    p = w.clamp(off + 12)
    pe = w.clamp(off + length - 4)
    if check == "full":  # a real footer CRC takes the slow path, which checks it
        w.require((w.words[pe] & np.uint64(0xFFFFFFFF)) == np.uint64(SMDEBUG_PAYLOAD_FOOTER))

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

    # Metadata: this project's writers put exactly ("mode_step", <index's mode step>) and
    # ("mode", <index's mode>) there; compared whole. Other records (another writer's
    # order, a marker, a mode step that differs from the index's) take the general walk.
    same = np.zeros(n, bool)
    if expected_metadata is not None:
        texts, which = expected_metadata
        lengths_of = np.fromiter(map(len, texts), np.int64, len(texts))
        want = lengths_of[which]
        same = w.ok & (m_end - t_end == want)
        width = -(-int(lengths_of.max(initial=0)) // 8) * 8
        table = np.frombuffer(b"".join(t.ljust(width, b"\0") for t in texts), "<u8").reshape(len(texts), -1)
        for j in range(width // 8):
            left = np.clip(want - 8 * j, 0, 8).astype(np.uint64)
            mask = np.where(left == 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                            (np.uint64(1) << (np.uint64(8) * left)) - np.uint64(1))
            same &= (w.words[w.clamp(t_end + 8 * j)] & mask) == table[which, j]
    other = np.flatnonzero(w.ok & ~same)
    if len(other):
        sub = _Walk(u, np.ones(len(other), bool))
        _plugin_entries(sub, m_pos[other], m_end[other])
        w.ok[other] &= sub.ok
    w.same = same
    return w, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe


def _tags_match(w: _Walk, tag_start, tag_len, name_ids, names: List[bytes]):
    """Per record: its tag is the name the index gives (one comparison per distinct name)."""
    out = np.zeros(len(tag_start), bool)
    if not len(name_ids):
        return out
    order = np.argsort(name_ids, kind="stable")
    bounds = np.flatnonzero(np.diff(name_ids[order])) + 1
    for group in np.split(order, bounds):
        pattern = names[name_ids[group[0]]]
        idx = group[tag_len[group] == len(pattern)]
        if len(idx):
            out[idx] = w.word_eq(tag_start[idx], pattern)
    return out


def _values_of(w: _Walk, dtype, c_start, idx):
    """float64 values of the one-element contents at ``c_start[idx]``, by wire dtype."""
    out = np.empty(len(idx), np.float64)
    codes = dtype[idx]
    words = w.words[c_start[idx]]  # the content's bytes, and what follows, as one word
    for code in np.unique(codes).tolist():
        np_dtype = _FAST_DTYPES[code]
        sub = np.flatnonzero(codes == code)
        bits = words[sub]
        size = np_dtype.itemsize
        if size < 8:
            bits = (bits & np.uint64((1 << (8 * size)) - 1)).astype(f"<u{size}")
        out[sub] = bits.view(np_dtype).astype(np.float64)
    return out


def _scalar_of(value: np.ndarray) -> Optional[float]:
    """A decoded value as one float, or None when it is not one real number."""
    if value.size != 1 or value.dtype.kind not in "biufV":  # V: bfloat16 and the other ml_dtypes
        return None
    try:
        return float(value.reshape(-1)[0])
    except (TypeError, ValueError):
        return None


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
    loaded (a few tuple operations per index file), read by :func:`collect` with numpy masks
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


class _Rows:
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

    def subset(self, idx: np.ndarray) -> "_Rows":
        """The rows ``idx`` only."""
        return _Rows({k: v[idx] for k, v in self.columns.items()}, self.files, self.names,
                     {k: (codes[idx], cats) for k, (codes, cats) in self.texts.items()})

    def location(self, i: int):
        """Row ``i`` as the TensorLocation ``value()`` reads."""
        from .tensor import TensorLocation

        c = self.columns
        crc = int(c["crc"][i])
        return TensorLocation(self.files[int(c["file"][i])], int(c["start"][i]), int(c["length"][i]),
                              None if crc < 0 else crc, self.names[int(c["name"][i])])


_MODE_NUMBER = {m: m.value for m in ModeKeys}


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


def _step_table(trial):
    """``(global steps, mode numbers, mode steps)`` of every loaded step, as arrays.

    Kept on the trial until more steps are loaded: steps are only ever added, and a step's
    mode and mode step never change once loaded (the first index file of a step wins)."""
    to_mode = trial._global_to_mode
    n = len(to_mode)
    cached = trial.__dict__.get("_bulk_step_table")
    if cached is not None and cached[0] == n:
        return cached[1]
    steps = np.fromiter(to_mode, np.int64, n)
    pairs = list(to_mode.values())
    modes = np.fromiter(map(_MODE_NUMBER.__getitem__, map(_FIRST, pairs)), np.int64, n)
    mode_steps = np.fromiter(map(_SECOND, pairs), np.int64, n)
    if n > 1 and not (steps[1:] > steps[:-1]).all():  # loaded bucket by bucket: usually sorted already
        order = np.argsort(steps)
        steps, modes, mode_steps = steps[order], modes[order], mode_steps[order]
    table = (steps, modes, mode_steps)
    trial._bulk_step_table = (n, table)
    return table


_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _positions(known: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Where each of ``steps`` (all loaded steps) is in the sorted ``known``: a lookup table
    when the steps are dense (a gather instead of a binary search per row), else a search."""
    if len(known) and len(steps) > 4096 and known[-1] - known[0] < 4 * len(known) + 4096:
        table = np.zeros(int(known[-1] - known[0]) + 1, np.int64)
        table[known - known[0]] = np.arange(len(known))
        return table[steps - known[0]]
    return np.searchsorted(known, steps)


def _used(codes: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``codes`` (ids below ``size``), sorted."""
    return np.flatnonzero(np.bincount(codes, minlength=size)) if len(codes) else np.zeros(0, np.int64)


def _sorted_codes(codes: np.ndarray, items: List[str]) -> Tuple[np.ndarray, List[str]]:
    """Codes into ``items`` recoded into the sorted list of the items they use."""
    used = _used(codes, len(items)).tolist()
    categories = sorted(items[i] for i in used)
    lookup = np.zeros(len(items), _code_dtype(len(categories)))
    rank = {c: k for k, c in enumerate(categories)}
    for i in used:
        lookup[i] = rank[items[i]]
    return lookup[codes], categories


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


def collect(trial, tensors, modes, steps, workers, include_incomplete: bool) -> _Rows:
    """Every saved reduction, and every raw record small enough to be a scalar, of the
    selected tensors at the selected steps (see ``Trial.to_table``)."""
    log: RecordLog = trial._records
    c = log.arrays()
    if log.has_repeats:
        keep_rows = _last_of_repeats(c)
        c = {k: v[keep_rows] for k, v in c.items()}
    keep = np.zeros(len(log.tensors.items), bool)
    # Raw values: only records small enough to hold one element are read.
    limit = np.zeros(len(keep), np.int64)
    for tensor in tensors:
        i = log.tensors.ids.get(tensor.name)
        if i is not None:
            keep[i] = True
            limit[i] = _SCALAR_RECORD_MAX + 8 * len(tensor.name.encode("utf-8"))
    t = c["tensor"]
    mask = keep[t] & ((c["label"] != 0) | (c["length"] <= limit[t]))
    if workers is not None:
        wanted = np.asarray([w in workers for w in log.workers.items], bool)
        mask &= wanted[c["worker"]]
    if modes is not None or steps is not None:
        known, mode_of, mode_step_of = _step_table(trial)
        at = _positions(known, c["step"])
        if modes is not None:
            mask &= np.isin(mode_of[at], np.asarray(sorted(m.value for m in modes)))
        if steps is not None:
            numbers = c["step"] if modes is None else mode_step_of[at]
            mask &= np.isin(numbers, np.asarray(sorted(steps), np.int64))
    if not include_incomplete and not trial.loaded_all_steps:
        late = mask & (c["step"] > trial.last_complete_step)
        if late.any():
            late_steps = np.unique(c["step"][late])
            done = late_steps[np.fromiter(map(trial._is_complete, late_steps.tolist()), bool, len(late_steps))]
            mask &= ~late | np.isin(c["step"], done)
    if not mask.all():
        c = {k: v[mask] for k, v in c.items()}
    texts = {"tensor": _sorted_codes(c["tensor"], log.tensors.items),
             "worker": _sorted_codes(c["worker"], log.workers.items),
             "reduction": _sorted_codes(c["label"], log.labels.items)}
    rows = _Rows(c, log.files.items, log.names.items, texts)
    rows.file_info = log.file_info()
    return rows


class _FilePlan:
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


def read_rows(trial, rows: _Rows, progress: Optional[bool], on_error: str = "warn") -> "Table":
    """Read the values of ``rows`` (from :func:`collect`) into a :class:`Table`.

    Files whose wanted records have the layout of many others are checked and decoded
    together (:func:`_read_layouts`); the other rows, and rows those checks do not accept,
    go through :func:`_read_general`, which reports what is wrong with them.
    """
    from .trial import _progress_bar, _progress_wanted

    n = len(rows)
    if not n:
        return Table.empty()
    c = rows.columns
    step_table = _step_table(trial)
    plan = _FilePlan(c)
    nfiles = len(plan.first)
    wanted = nfiles >= _PROGRESS_MIN_FILES and _progress_wanted(trial.progress if progress is None else progress)
    bar = _progress_bar(wanted, nfiles, "reading event files")
    values = np.full(n, np.nan)
    keep = np.zeros(n, bool)
    errors: List[str] = []
    try:
        done = _read_layouts(trial, rows, plan, step_table, values, keep, bar)
        rest = np.flatnonzero(~done)
        lost = 0
        if len(rest):
            sub_values, sub_keep, lost = _read_general(trial, rows.subset(rest), step_table, bar, on_error, errors)
            values[rest] = sub_values
            keep[rest] = sub_keep
    finally:
        if bar is not None:
            bar.close()
    if errors:
        logger.warning("smdebug: %d record(s) could not be read and are left out of the table (%d error(s)); "
                       "the first: %s", lost, len(errors), errors[0])
    return Table.build(trial, keep, c["step"], rows.texts, values, step_table)


# ---------------------------------------------------------------- files of one layout
#
# Runs write the same records step after step, so most event files of a run hold their
# wanted records at the same offsets, with the same lengths and names. Such files are read
# side by side into one buffer (a row per file) and compared with one of them, the
# *model*, fully checked by _walk: every byte of its records must be equal in the others,
# except the bytes that legitimately vary (wall time, step varint, value, mode step
# digits), which get their own checks. A file that passes is therefore parsed exactly as
# the model, and its values lie at the model's offsets. Payload CRC32Cs: one CRC32C per
# file over each run of adjacent records, compared with the CRC that the index's payload
# CRC32Cs imply (CRC32C is affine: see _runs_match_index_crcs). A file that fails any check
# goes to the record by record walk, which says which records are damaged.

_LAYOUT_MIN_FILES = 8  # fewer files of one layout: the general walk
_LAYOUT_MAX_SPAN = 1 << 20  # longer spans: the general walk
_LAYOUT_BATCH_BYTES = 2 << 20  # buffer for one batch of files of one layout (a few are reused)
_LAYOUT_MODELS = 3  # files tried as the model of a batch
_READ_AHEAD = 2  # batches being read, or read and waiting, while one is checked
# One reading thread: a second one made the whole slower on two cores (more time waiting
# for the GIL between system calls, for the thread checking the batches too).
_READ_THREADS = 1


def _mix(x, in_place: bool = False) -> np.ndarray:
    """A 64-bit hash of each integer (splitmix64's finalizer); wraps modulo 2^64.
    ``in_place``: ``x`` is a uint64 array that may be overwritten."""
    x = x if in_place else np.asarray(x).astype(np.uint64)
    shifted = np.empty_like(x)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(x, np.uint64(shift), out=shifted)
        x ^= shifted
        if factor is not None:
            x *= np.uint64(factor)
    return x


def _digit_count(x: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer (a mode step's text length)."""
    return np.searchsorted(10 ** np.arange(1, 19, dtype=np.int64), x, side="right") + 1


def _varint_size(x: np.ndarray) -> np.ndarray:
    """Bytes of each non-negative integer as a protobuf varint (an Event.step's length)."""
    return np.searchsorted(np.int64(1) << (7 * np.arange(1, 9, dtype=np.int64)), x, side="right") + 1


def _layout_groups(c, plan: _FilePlan, step_table, file_info=None) -> List[np.ndarray]:
    """Files (indices into the plan) whose wanted records have exactly the same offsets in
    their span, lengths and names, and whose steps have the same mode and the same number of
    step varint bytes and mode step digits: one array per group of at least
    ``_LAYOUT_MIN_FILES`` files. ``file_info``: :meth:`RecordLog.file_info`."""
    order, first, count, fos = plan.order, plan.first, plan.count, plan.file_of_sorted
    length = plan.sorted(c["length"])
    span = plan.hi - plan.lo
    longest = np.maximum.reduceat(length, first)
    eligible = plan.coalesce & (span <= _LAYOUT_MAX_SPAN) & (longest <= _FAST_MAX_RECORD)
    candidates = np.flatnonzero(eligible)
    if len(candidates) < _LAYOUT_MIN_FILES:
        return []
    known, mode_of, mode_step_of = step_table
    steps = c["step"][order[first]]
    at = np.searchsorted(known, steps)
    kind = mode_of[at] + 8 * (_digit_count(mode_step_of[at]) + 32 * _varint_size(steps))
    if file_info is not None:
        # Files read whole (every record of their index file wanted): the index file's
        # template (names) and layout (offsets, lengths) say everything; no hashing needed.
        template, layout, records = file_info
        file_id = c["file"][order[first[candidates]]]
        if (records[file_id] == count[candidates]).all():
            key = (template[file_id] * (int(layout.max(initial=0)) + 1) + layout[file_id]) * 4096 + kind[candidates]
            if int(template.max(initial=0) + 1) * (int(layout.max(initial=0)) + 1) < 1 << 50:
                return _groups_of(candidates, key)
    rel = plan.sorted(c["start"]) - plan.lo[fos]
    name = plan.sorted(c["name"])
    # Per file: a hash of its records' (offset, length, name, rank) and of its step's kind;
    # equal hashes are checked for exact equality below.
    # (Fields may overlap in the packed value: that only makes more hashes collide.)
    packed = np.arange(len(order), dtype=np.uint64)
    packed -= first[fos].astype(np.uint64)  # the record's rank in its file
    packed <<= np.uint64(37)
    packed += rel.astype(np.uint64)
    packed += length.astype(np.uint64) << np.uint64(20)
    record_hash = _mix(packed, in_place=True)
    record_hash += name.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    key = _mix(np.add.reduceat(record_hash, first) + _mix(count + (span << 24))) ^ _mix(kind + (1 << 50))
    groups = []
    for files in _groups_of(candidates, key[candidates]):
        m = int(count[files[0]])
        if not (count[files] == m).all():
            files = files[count[files] == m]
        at_rows = first[files][:, None] + np.arange(m)
        same = (span[files] == span[files[0]]) & (kind[files] == kind[files[0]])
        for column in (rel, length, name):
            block = column[at_rows]
            same &= (block == block[0]).all(axis=1)
        files = files[same]
        if len(files) >= _LAYOUT_MIN_FILES:
            groups.append(files)
    return groups


def _groups_of(items: np.ndarray, key: np.ndarray) -> List[np.ndarray]:
    """``items`` grouped by equal ``key`` (order kept within a group); groups of at least
    ``_LAYOUT_MIN_FILES``."""
    _, inverse, sizes = np.unique(key, return_inverse=True, return_counts=True)
    by_group = np.argsort(inverse.reshape(-1), kind="stable")
    bounds = np.r_[0, np.cumsum(sizes)]
    return [items[by_group[bounds[g]:bounds[g + 1]]] for g in np.flatnonzero(sizes >= _LAYOUT_MIN_FILES).tolist()]


def _read_into(storage, spans, buffer: np.ndarray, places: List[int], threads: bool = True) -> list:
    """Per span the number of bytes read into ``buffer`` at its place, or the exception."""
    reader = getattr(storage, "read_spans_into", None)
    if reader is not None:
        return reader(spans, memoryview(buffer), places, threads=threads)
    out = []
    for place, data in zip(places, storage.read_spans(spans)):
        if isinstance(data, bytes):
            buffer[place:place + len(data)] = np.frombuffer(data, np.uint8)
            data = len(data)
        out.append(data)
    return out


def _read_batches(storage, rows: _Rows, plan: _FilePlan, batches):
    """Per batch ``(files, span, stride, ...)``: ``(batch, table, flat, results)``, its
    files' spans read into ``table``, a ``(files, stride)`` uint8 array, a row per file
    (``flat``: the same bytes followed by ``_PAD`` zero bytes).

    The arrays are views of a few reused buffers (fresh memory costs a page fault per 4 KiB
    written). With several batches on local storage, a thread reads the next batches while
    the caller checks this one: the reads wait on system calls, the checks are numpy loops
    that release the GIL. A batch's array is valid until the next one is asked for."""
    size = max(len(b[0]) * b[2] for b in batches) + _PAD

    def read(buffer, batch, span, stride, *_, threads=True):
        g = len(batch)
        table = buffer[:g * stride].reshape(g, stride)
        buffer[g * stride:g * stride + _PAD] = 0
        file_ids = rows.columns["file"][plan.order[plan.first[batch]]].tolist()
        spans = [(rows.files[f], o, span) for f, o in zip(file_ids, plan.lo[batch].tolist())]
        results = _read_into(storage, spans, buffer, list(range(0, g * stride, stride)), threads)
        if span < stride:
            table[:, span:] = 0
        return table, buffer[:g * stride + _PAD], results

    def one_by_one():
        buffer = np.zeros(size, np.uint8)
        for batch in batches:
            yield (batch,) + read(buffer, *batch)

    if len(batches) == 1 or not hasattr(storage, "read_spans_into"):
        yield from one_by_one()
        return
    # The next batches are read on another thread while the caller checks this one.
    free = [np.zeros(size, np.uint8) for _ in range(_READ_AHEAD + 1)]
    pending: "deque" = deque()
    todo = iter(batches)

    def submit():
        batch = next(todo, None)
        if batch is not None:
            buffer = free.pop()
            pending.append((batch, buffer, pool.submit(read, buffer, *batch, threads=False)))

    with ThreadPoolExecutor(max_workers=_READ_THREADS, thread_name_prefix="smdebug-table-reader") as pool:
        try:
            submit()
        except RuntimeError:  # no thread can be started (interpreter shutting down...)
            yield from one_by_one()
            return
        try:
            for _ in range(_READ_AHEAD - 1):
                submit()
            while pending:
                batch, buffer, future = pending.popleft()
                yield (batch,) + future.result()
                free.append(buffer)
                submit()
        finally:
            for _, _, future in pending:
                future.cancel()


def _read_layouts(trial, rows: _Rows, plan: _FilePlan, step_table, values, keep, bar) -> np.ndarray:
    """Read and decode the files of :func:`_layout_groups`; returns the rows settled (a
    value, or left out as a tensor of several elements)."""
    c = rows.columns
    done = np.zeros(len(rows), bool)
    groups = _layout_groups(c, plan, step_table, rows.file_info)
    if not groups:
        return done
    crc_sorted = plan.sorted(c["crc"])
    batches = []
    for number, files in enumerate(groups):
        span = int(plan.hi[files[0]] - plan.lo[files[0]])
        stride = -(-span // 8) * 8
        per_batch = max(1, _LAYOUT_BATCH_BYTES // stride)
        batches += [(files[at:at + per_batch], span, stride, number) for at in range(0, len(files), per_batch)]
    by_layout = 0
    models = {}  # group -> its model, from the group's first batch
    for (batch, span, stride, number), table, flat, results in _read_batches(trial._storage, rows, plan, batches):
        settled = _read_layout_batch(trial, rows, plan, step_table, batch, span, crc_sorted, values, keep, done,
                                     table, flat, results, models, number)
        by_layout += settled
        if bar is not None:
            bar.update(settled)
    stats = trial.stats
    stats["table_records_bulk"] = stats.get("table_records_bulk", 0) + int(keep.sum())
    stats["table_files_by_layout"] = stats.get("table_files_by_layout", 0) + by_layout
    return done


def _read_layout_batch(trial, rows, plan, step_table, batch, span, crc_sorted, values, keep, done,
                       table, flat, results, models, number) -> int:
    """One batch of files of one layout, read (see above); returns how many files it settled."""
    c = rows.columns
    order, first = plan.order, plan.first
    m = int(plan.count[batch[0]])
    g, stride = table.shape
    got = np.fromiter(map(operator.eq, results, repeat(span)), bool, g)  # an exception is no int
    at_rows = first[batch][:, None] + np.arange(m)  # positions in plan.order, a row per file
    row_ids = at_rows if plan.in_order else order[at_rows]
    rel = (c["start"][row_ids[0]] - plan.lo[batch[0]]).astype(np.int64)
    length = c["length"][row_ids[0]]
    model = models.get(number)
    if model is None:
        model = _layout_model(trial, c, rows.names, table, flat, row_ids, rel, length, got, step_table)
        if model is None:  # no good model in this batch: its files take the general walk
            return 0
        models[number] = model
    model_row, mask, klass, digit_cols, content = model
    words = table.view("<u8")
    model_words, mask_words = model_row.view("<u8"), mask.view("<u8")
    ok = got.copy()
    chunk = max(1, (1 << 18) // stride)  # a few hundred files at a time: stays in cache
    differ = np.empty((min(chunk, g), stride // 8), np.uint64)
    for at in range(0, g, chunk):
        part = words[at:at + chunk]
        d = differ[:len(part)]
        np.bitwise_xor(part, model_words, out=d)
        d &= mask_words
        ok[at:at + chunk] &= ~d.any(axis=1)
    if len(digit_cols):
        ok &= ((table[:, digit_cols] - np.uint8(0x30)) < 10).all(axis=1)
    files_ok = np.flatnonzero(ok)
    if len(files_ok):
        ok[files_ok] = _runs_match_index_crcs(table, files_ok, model_row, _runs(rel, length), rel, length,
                                              crc_sorted[at_rows[files_ok]])
        files_ok = np.flatnonzero(ok)
    if not len(files_ok):
        return 0
    rows_ok = row_ids[files_ok]
    sub = table if len(files_ok) == g else table[files_ok]
    for code, slots, starts in content:
        np_dtype = _FAST_DTYPES[code]
        picked = sub[:, (starts[:, None] + np.arange(np_dtype.itemsize)).reshape(-1)]
        ids = rows_ok[:, slots].reshape(-1)
        values[ids] = np.ascontiguousarray(picked).view(np_dtype).astype(np.float64).reshape(-1)
        keep[ids] = True
    # Records of several elements are well formed and no scalar: settled, without a row.
    done[rows_ok[:, klass != 0]] = True
    return len(files_ok) if (klass != 0).all() else 0


def _layout_model(trial, c, names, table, flat, row_ids, rel, length, got, step_table):
    """Check a model file of the batch (``table``, the same bytes as ``flat`` followed by
    ``_PAD`` zeros) with :func:`_walk` and describe its layout: ``(model's bytes, mask, klass,
    digit_cols, content)``, or None when none of the files tried is one. ``klass`` per record:
    1 a scalar, 2 a well-formed tensor of several elements, 0 anything else (left to the
    general walk); ``mask`` per byte of a span: 0xFF must equal the model, 0x80 only the
    high bit (varint bytes), 0 anything (varying bytes and bytes of other records)."""
    known, mode_of, mode_step_of = step_table
    m = len(rel)
    best = None
    buffer = flat
    stride = table.shape[1]
    readable = np.flatnonzero(got)
    # Files tried: the first, the middle and the last one read (damage tends to come in runs).
    tried = dict.fromkeys(readable[[0, len(readable) // 2, -1]].tolist()) if len(readable) else {}
    for j in list(tried)[:_LAYOUT_MODELS]:
        off = j * stride + rel
        step = int(c["step"][row_ids[j, 0]])
        at = int(np.searchsorted(known, step))
        metadata = metadata_field(int(mode_of[at]), int(mode_step_of[at]))
        w, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe = _walk(
            buffer, off, length, off + length, trial._record_check, ([metadata], np.zeros(m, np.int64)))
        name_ids = c["name"][row_ids[j]]
        tags = np.fromiter((bytes(buffer[a:b]) == names[i].encode("utf-8")
                            for a, b, i in zip(tag_start.tolist(), tag_stop.tolist(), name_ids.tolist())), bool, m)
        ok = w.ok & w.same & tags
        size = np.array([_FAST_DTYPES[d].itemsize if d in _FAST_DTYPES else 0 for d in dtype.tolist()])
        ok &= size > 0
        c_len = c_stop - c_start
        several = ok & (c_len > size) & (c_len % np.maximum(size, 1) == 0)
        klass = np.where(ok & unit & (c_len == size), 1, np.where(several, 2, 0))
        if best is None or (klass != 0).sum() > (best[1] != 0).sum():
            best = (j, klass, dtype, c_start - j * stride, c_stop - j * stride, p - j * stride, pe - j * stride,
                    len(b"%d" % int(mode_step_of[at])))
        if (klass != 0).all():
            break
    if best is None or not (best[1] != 0).any():
        return None
    j, klass, dtype, c_start, c_stop, p, pe, digits_len = best
    row = buffer[j * stride:(j + 1) * stride]
    mask = np.zeros(stride, np.uint8)
    digit_cols, content = [], {}
    for r in np.flatnonzero(klass).tolist():
        mask[int(rel[r]):int(rel[r] + length[r])] = 0xFF
        varying = []
        pos = int(p[r])
        if row[pos] == 0x09:  # wall_time: any 8 bytes
            varying += range(pos + 1, pos + 9)
            pos += 9
        if row[pos] == 0x10:  # Event.step: a varint of the model's length (high bits checked)
            q = pos + 1
            while row[q] >= 0x80:
                q += 1
            mask[pos + 1:q + 1] = 0x80
        cs, ce = int(c_start[r]), int(c_stop[r])
        varying += range(cs, ce)
        # The metadata starts where the tensor ends (its 0x4A key); the digits 17 bytes on.
        digits = range(ce + 17, ce + 17 + digits_len)
        digit_cols += digits
        varying += digits
        mask[varying] = 0
        if klass[r] == 1:
            content.setdefault(int(dtype[r]), []).append((r, cs))
    content_list = [(code, np.asarray([r for r, _ in items]), np.asarray([s for _, s in items], np.intp))
                    for code, items in content.items()]
    return row.copy(), mask, klass, np.asarray(digit_cols, np.intp), content_list


def _runs(rel: np.ndarray, length: np.ndarray) -> List[Tuple[int, int, int, int]]:
    """The records (sorted by offset) as runs of adjacent ones: ``(first, stop, start byte,
    end byte)`` each."""
    runs = []
    first = 0
    for r in range(1, len(rel) + 1):
        if r == len(rel) or rel[r] != rel[r - 1] + length[r - 1]:
            runs.append((first, r, int(rel[first]), int(rel[r - 1] + length[r - 1])))
            first = r
    return runs


@functools.lru_cache(maxsize=64)
def _shift_tables(distances: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """For each distance, CRC32C's register advanced over that many zero bytes (a linear
    map of its 32 bits) as four 256-entry tables, one per byte of the register; all
    concatenated, and where each byte's table starts."""
    images = []
    for distance in distances:
        zeros = bytes(distance)
        images += [google_crc32c.extend((1 << bit) ^ 0xFFFFFFFF, zeros) ^ 0xFFFFFFFF for bit in range(32)]
    basis = np.array(images, np.uint32).reshape(len(distances), 4, 8)
    tables = np.zeros((len(distances), 4, 256), np.uint32)
    for b in range(8):  # the entries whose top set bit is b
        tables[:, :, 1 << b:2 << b] = tables[:, :, :1 << b] ^ basis[:, :, b:b + 1]
    return tables.reshape(-1), np.arange(4 * len(distances), dtype=np.intp) * 256


def _shifted_xor(values: np.ndarray, distances: Tuple[int, ...]) -> np.ndarray:
    """Per row of ``values`` (uint32, a column per distance): the XOR of each value's
    register advanced over its column's distance of zero bytes; one table lookup per byte."""
    flat, base = _shift_tables(distances)
    index = np.ascontiguousarray(values, "<u4").view(np.uint8).reshape(len(values), -1).astype(np.intp)
    index += base
    return np.bitwise_xor.reduce(flat.take(index), axis=1)


def _runs_match_index_crcs(table: np.ndarray, files: np.ndarray, model: np.ndarray, runs, rel, length,
                           crcs: np.ndarray):
    """Per file (rows ``files`` of ``table``): the CRC32C of each run of its records equals
    the one its index's payload CRC32Cs imply.

    CRC32C is affine: two byte strings of one length that differ only inside payloads have
    CRCs that differ by the payloads' CRC differences, each advanced over the bytes that
    follow it. With the ``model``'s bytes (whose framing bytes every checked file shares),
    a run's expected CRC is the model's XOR, per record, (index CRC XOR the model's payload
    CRC) advanced to the end of the run; one CRC32C call per file and run checks all its
    records. A file fails when any record's payload differs from what its index CRC says,
    unless the CRC changes of two or more damaged records cancel exactly (for random damage
    as likely, 2^-32, as one record's CRC32C missing it). Records without an index CRC
    (other writers) are not checked, as value() does not check them; a run where only some
    have one is not accepted here (the record by record walk checks those)."""
    ok = np.ones(len(files), bool)
    for first, stop, start, end in runs:
        want = crcs[:, first:stop]
        has = want >= 0
        every = has.all(axis=1)
        ok &= every | ~has.any(axis=1)
        check = np.flatnonzero(ok & every)
        if not len(check):
            continue
        picked = files[check]
        rows = table[:, start:end] if len(picked) == len(table) else table[picked, start:end]
        actual = np.fromiter(map(google_crc32c.value, rows), np.int64, len(rows))
        ends = [int(rel[r] + length[r] - 4) for r in range(first, stop)]
        model_payload = np.array([google_crc32c.value(model[int(rel[r]) + 12:e].tobytes())
                                  for r, e in zip(range(first, stop), ends)], np.int64)
        delta = np.ascontiguousarray((want[check] ^ model_payload).astype("<u4"))
        expected = _shifted_xor(delta, tuple(end - e for e in ends)).astype(np.int64)
        expected ^= google_crc32c.value(model[start:end].tobytes())
        ok[check[actual != expected]] = False
    return ok


def _read_general(trial, rows: _Rows, step_table, bar, on_error: str, errors: List[str]):
    """Read the values of ``rows`` record by record: ``(values, keep, lost)``. Errors are
    appended to ``errors`` (or raised, with ``on_error="raise"``)."""
    from .tensor import _Request, read_event_file

    n = len(rows)
    c = rows.columns
    start, length, g_all = c["start"], c["length"], c["step"]
    texts = rows.texts
    worker_codes = texts["worker"][0]
    plan = _FilePlan(c)
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
    storage = trial._storage
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
                    data = read_event_file(trial, span[0], [span[1:]], int(g_all[row]),
                                           tensor_names[tensor_codes[row]])[0]
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
    chunks.append(bytes(_PAD))  # zeros after the last record: word reads stay in bounds
    joined = b"".join(chunks)
    del chunks
    u = np.frombuffer(joined, np.uint8)

    # The metadata each record should have, from the index's mode and mode step of its step.
    known, mode_of, mode_step_of = step_table
    used, which = np.unique(np.searchsorted(known, g_all), return_inverse=True)
    texts_md = list(map(metadata_field, mode_of[used].tolist(), mode_step_of[used].tolist()))
    w, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe = _walk(
        u, base, length, avail, trial._record_check, (texts_md, which.reshape(-1)))
    ok = w.ok & ~failed
    # The name each record must carry (the index's).
    used_names, name_ids = np.unique(c["name"], return_inverse=True)
    ok &= _tags_match(w, tag_start, tag_stop - tag_start, name_ids.reshape(-1),
                      [rows.names[i].encode("utf-8") for i in used_names.tolist()])
    itemsize = np.zeros(256, np.int64)
    for code, np_dtype in _FAST_DTYPES.items():
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
    values[fast] = _values_of(w, dtype, c_start, fast)

    # Everything else, one record at a time, as Tensor.value() reads it.
    slow = np.flatnonzero(~scalar & ~several & ~failed)
    lost = int(failed.sum())  # values lost with their event file
    stats = trial.stats
    stats["table_records_bulk"] = stats.get("table_records_bulk", 0) + len(fast)
    stats["table_records_one_by_one"] = stats.get("table_records_one_by_one", 0) + len(slow)
    if len(slow):
        tensors = trial._tensors
        worker_names = texts["worker"][1]
        view = memoryview(joined)
        for i in slow.tolist():
            location = rows.location(i)
            stop = min(int(base[i]) + location.length, int(avail[i]))
            tensor = tensors[tensor_names[tensor_codes[i]]]
            try:
                value = tensor._decode(view[int(base[i]):stop],
                                       _Request(None, location, int(g_all[i]), worker_names[worker_codes[i]]))
            except CorruptRecord as exc:
                errors.append(str(exc))
                lost += 1
                if on_error == "raise":
                    raise
                continue
            number = _scalar_of(value)
            if number is not None:
                values[i] = number
                keep[i] = True
    return values, keep, lost


def _compact(codes: np.ndarray, categories: List[str]):
    """Codes and categories with the categories no row uses dropped (order kept)."""
    used = _used(codes, len(categories))
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
    def build(cls, trial, keep, steps, texts, values, step_table=None):
        """The rows marked in ``keep``; ``texts``: column -> (codes per row, categories)."""
        if not keep.any():
            return cls.empty()
        every = keep.all()
        if not every:
            steps, values = steps[keep], values[keep]
        known, mode_of, mode_step_of = _step_table(trial) if step_table is None else step_table
        at = _positions(known, steps)
        # Modes: per loaded step first (few), then per row once the rows are sorted.
        step_used = np.zeros(len(known), bool)
        step_used[at] = True
        present = _used(mode_of[step_used], max(_MODE_NUMBER.values()) + 1)
        mode_codes = np.zeros(max(_MODE_NUMBER.values()) + 1, np.int8)
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
        if trial.worker_step_conflicts:
            _own_numbering(trial.worker_step_conflicts, numbers, texts)
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

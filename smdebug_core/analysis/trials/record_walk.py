"""Parsing many one-tensor records at once with numpy (docs/format.md 2.1-2.3).

The records lie in one buffer; :func:`walk_records` follows them all in lockstep, field by
field, as arrays of positions, and accepts only the exact layout of a one-tensor ``Event``
(the keys and the metadata field that ``storage/format/wire.py`` describes): framing and
length CRC, a numeric dtype, unit dimensions, mode/mode step metadata of digits. What it
does not accept is left to the one-by-one decoder.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from ...modes import ModeKeys
from ...storage.format import wire
from ...storage.format.codec import WIRE_TO_NUMPY
from ...storage.format.records import FOOTER_SIZE, HEADER_SIZE, RECORD_OVERHEAD, SMDEBUG_PAYLOAD_FOOTER, record_header

#: Wire types of real numbers that come back from tensor_content as they are.
FAST_DTYPES = {code: dtype for code, dtype in WIRE_TO_NUMPY.items() if dtype.kind in "biuf"}
PAD = 32  # zero bytes after the buffer: gathers a few bytes past a record stay in bounds
_MODE_STEP = wire.MODE_STEP_KEY.encode()
_MODE = wire.MODE_KEY.encode()
_MODE_DIGITS = b"".join(b"%d" % m.value for m in ModeKeys)  # one digit each
#: Longer records are left to the one-by-one decoder (a scalar record is far shorter).
FAST_MAX_RECORD = 1 << 16
_MAX_DIMS = 8
_MAX_PLUGIN_ENTRIES = 3


class _Walk:
    """Positions of every record in one buffer ``u``, parsed in lockstep; ``ok`` says which
    records still follow the expected layout. Positions are clamped into the buffer, so a
    record that went wrong only produces nonsense for itself, which ``ok`` then excludes.
    Checks take an optional ``where`` mask: records outside it are not checked (a field
    that is optional and absent there)."""

    def __init__(self, u: np.ndarray, ok: np.ndarray):
        self.u = u
        self.ok = ok
        self.limit = len(u) - PAD
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
        e_pos, e_end = w.field(pos, wire.KEY_PLUGIN_DATA, m_end, active)
        n_pos, n_end = w.field(e_pos, wire.KEY_PLUGIN_NAME, e_end, active)
        x_pos, x_end = w.field(n_end, wire.KEY_PLUGIN_CONTENT, e_end, active)
        name_len, text_len = n_end - n_pos, x_end - x_pos
        is_step = w.equals(n_pos, name_len, _MODE_STEP) & w.digits(x_pos, text_len)
        first = w.u[x_pos]
        is_mode = w.equals(n_pos, name_len, _MODE) & (text_len == 1) & (first >= min(_MODE_DIGITS)) \
            & (first <= max(_MODE_DIGITS))
        w.require((is_step | is_mode) & (x_end == e_end), active)
        pos = np.where(active, e_end, pos)
    w.require(pos >= m_end)


def walk_records(u: np.ndarray, off: np.ndarray, length: np.ndarray, avail: np.ndarray, check: str,
          expected_metadata=None):
    """Parse one-tensor records in bulk (docs/format.md 2.1-2.3).

    ``off``/``length``: each record's place in ``u``, as the index gives it; ``avail``: where
    the bytes read for it end. Returns ``(ok, dtype, unit, content_start, content_stop,
    tag_start, tag_stop, payload_start, payload_stop)``: ``ok`` marks records that have
    exactly the expected layout, ``unit`` those whose shape has only dimensions of size 1.
    """
    n = len(off)
    ok = (length >= RECORD_OVERHEAD) & (length <= FAST_MAX_RECORD) & (off + length <= avail)
    w = _Walk(u, ok)
    off = w.clamp(off)
    length = np.where(ok, length, RECORD_OVERHEAD)
    # Framing (docs/format.md 2.1): the header must be the one a payload of this length has,
    # which checks the length and its CRC in one comparison.
    seen = np.zeros(FAST_MAX_RECORD + 1, bool)
    seen[length] = True
    head_len = np.zeros(FAST_MAX_RECORD + 1, np.uint64)
    head_crc = np.zeros(FAST_MAX_RECORD + 1, np.uint64)
    for x in np.flatnonzero(seen).tolist():
        header = record_header(x - RECORD_OVERHEAD)
        head_len[x] = int.from_bytes(header[:8], "little")
        head_crc[x] = int.from_bytes(header[8:], "little")
    w.require(w.words[off] == head_len[length])
    if check != "none":
        w.require((w.words[off + 8] & np.uint64(0xFFFFFFFF)) == head_crc[length])
    p = w.clamp(off + HEADER_SIZE)
    pe = w.clamp(off + length - FOOTER_SIZE)
    if check == "full":  # a real footer CRC takes the slow path, which checks it
        w.require((w.words[pe] & np.uint64(0xFFFFFFFF)) == np.uint64(SMDEBUG_PAYLOAD_FOOTER))

    # Event: wall_time (a key and 8 bytes), step (a varint), summary.
    pos = p + 9 * (u[p] == wire.KEY_EVENT_WALL_TIME)
    has_step = w.present(pos, wire.KEY_EVENT_STEP, pe)
    _, after = w.varint(w.clamp(pos + 1), has_step)
    pos = np.where(has_step, after, pos)
    pos, s_end = w.field(pos, wire.KEY_EVENT_SUMMARY, pe)
    w.require(s_end == pe)
    # Summary: exactly one value.
    pos, v_end = w.field(pos, wire.KEY_SUMMARY_VALUE, s_end)
    w.require(v_end == s_end)
    # Value: tag, tensor, metadata, nothing else.
    tag_start, tag_stop = w.field(pos, wire.KEY_VALUE_TAG, v_end)
    t_pos, t_end = w.field(tag_stop, wire.KEY_VALUE_TENSOR, v_end)
    # TensorProto: dtype (one byte), tensor_shape (optional), tensor_content.
    w.require(u[t_pos] == wire.KEY_TENSOR_DTYPE)
    dtype = u[w.clamp(t_pos + 1)].astype(np.int64)
    w.require(dtype < 0x80)
    pos = w.clamp(t_pos + 2)
    has_shape = w.present(pos, wire.KEY_TENSOR_SHAPE, t_end)
    sh_pos, sh_end = w.field(pos, wire.KEY_TENSOR_SHAPE, t_end, has_shape)
    sh_pos = np.where(has_shape, sh_pos, pos)
    sh_end = np.where(has_shape, sh_end, pos)
    c_start, c_stop = w.field(sh_end, wire.KEY_TENSOR_CONTENT, t_end)
    w.require(c_stop == t_end)
    m_pos, m_end = w.field(t_end, wire.KEY_VALUE_METADATA, v_end)
    w.require(m_end == v_end)

    # Shape: dimensions {size, name}; `unit` when every size is 1.
    unit = np.ones(n, bool)
    pos = sh_pos
    for _ in range(_MAX_DIMS):
        active = w.ok & (pos < sh_end)
        if not active.any():
            break
        d_pos, d_end = w.field(pos, wire.KEY_SHAPE_DIM, sh_end, active)
        has_size = active & w.present(d_pos, wire.KEY_DIM_SIZE, d_end)
        size, after = w.varint(w.clamp(d_pos + 1), has_size)
        unit &= ~active | (has_size & (size == 1))
        q = np.where(has_size, after, d_pos)
        has_name = active & w.present(q, wire.KEY_DIM_NAME, d_end)
        _, name_end = w.field(q, wire.KEY_DIM_NAME, d_end, has_name)
        q = np.where(has_name, name_end, q)
        w.require(q == d_end, active)
        pos = np.where(active, d_end, pos)
    w.require(pos >= sh_end)

    # Metadata: this project's writers put exactly ("mode_step", <index's mode step>) and
    # ("mode", <index's mode>) there (wire.metadata_field); compared whole. Other records (another writer's
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


def tags_match(w: _Walk, tag_start, tag_len, name_ids, names: List[bytes]):
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


def values_of(w: _Walk, dtype, c_start, idx):
    """float64 values of the one-element contents at ``c_start[idx]``, by wire dtype."""
    out = np.empty(len(idx), np.float64)
    codes = dtype[idx]
    words = w.words[c_start[idx]]  # the content's bytes, and what follows, as one word
    for code in np.unique(codes).tolist():
        np_dtype = FAST_DTYPES[code]
        sub = np.flatnonzero(codes == code)
        bits = words[sub]
        size = np_dtype.itemsize
        if size < 8:
            bits = (bits & np.uint64((1 << (8 * size)) - 1)).astype(f"<u{size}")
        out[sub] = bits.view(np_dtype).astype(np.float64)
    return out


def scalar_of(value: np.ndarray) -> Optional[float]:
    """A decoded value as one float, or None when it is not one real number."""
    if value.size != 1 or value.dtype.kind not in "biufV":  # V: bfloat16 and the other ml_dtypes
        return None
    try:
        return float(value.reshape(-1)[0])
    except (TypeError, ValueError):
        return None

"""Record templates: the bytes of a step's records for every later step like it.

Steps of a run usually repeat: the same reductions and scalars, the same tags, dtypes and
shapes, in the same order. Their ``events/`` records then differ only in the values and
in the step's head and metadata bytes (:class:`~.codec.StepEncoder`), and lie at the same
offsets with the same lengths. A template built once from the first such step turns each
later step into a few C-level calls instead of assembling every record in Python.

Format knowledge only (docs/format.md 2.1, 3.1); nothing here does I/O. Each template also
keeps the index entries of its records (:func:`~.index.entries_json_template`), to be
completed with their CRCs.
"""
import operator

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .index import entries_json_template
from .records import HEADER_SIZE, RECORD_OVERHEAD, SMDEBUG_PAYLOAD_FOOTER, crc32c, crc32c_field_shares, \
    record_footer, record_header

#: The footer of every ``events/`` record: smdebug's constant (docs/format.md 2.1);
#: integrity is in the index's crc32c.
EVENT_FOOTER = record_footer(SMDEBUG_PAYLOAD_FOOTER)

_DTYPE_AND_SHAPE = operator.attrgetter("dtype", "shape")


def _windows(data, width):
    """Every ``width`` bytes of the 1-d uint8 array ``data`` as rows of a view: row ``k`` is
    ``data[k:k + width]``. The rows overlap; writing rows that do not (one per record) fills
    the bytes of many records with one numpy call and one copy per row."""
    return as_strided(data, shape=(max(data.size - width + 1, 0), width), strides=(data.strides[0],) * 2)


def _index_template(cache, tags, starts, lengths, base):
    """The index entries of records laid out at ``starts`` (with ``lengths``) from ``base``,
    a template to complete with their CRCs (format.index.entries_json_template), kept in
    ``cache`` per ``base`` (usually one: a step's only list of records)."""
    template = cache.get(base)
    if template is None:
        if len(cache) > 4:
            cache.clear()
        template = cache[base] = entries_json_template(tags, [base + start for start in starts], lengths)
    return template


class SmallRecordsLayout:
    """The event-file bytes of a list of small records (plain arrays and numpy scalars),
    as a template for later steps with the same tags, dtypes and shapes: it fills in the
    step's head, metadata and values and joins the whole list in one call."""

    __slots__ = ("tags", "types", "specs", "parts", "starts", "lengths", "payloads", "_index_templates")

    def __init__(self, tags, types, specs, parts, starts, lengths, payloads):
        self.tags = tags
        # The values' types the template was made for; a numeric numpy scalar's type fixes its dtype
        # and shape, so [(dtype, shape)] is only kept (and checked) when arrays are among them.
        self.types = types
        self.specs = specs if np.ndarray in types else None
        self.parts = parts  # per record: header, (head), middle, (array), (metadata + footer)
        self.starts = starts  # record offsets in the joined bytes
        self.lengths = lengths  # record lengths with framing
        self.payloads = payloads  # per record, the slice of the joined bytes its CRC covers
        self._index_templates = {}  # file offset of the first record -> format.index.entries_json_template

    def index_template(self, base):
        return _index_template(self._index_templates, self.tags, self.starts, self.lengths, base)

    @classmethod
    def build(cls, encoder, tags, arrays):
        """The layout of these records, or None when one of them is not a small plain array."""
        fixed = len(encoder.head) + len(encoder.metadata_field)
        specs, parts, starts, lengths, payloads = [], [], [], [], []
        offset = 0
        for tag, arr in zip(tags, arrays):
            if type(arr) is not np.ndarray and not isinstance(arr, np.generic):  # scalars: reductions as handed over
                return None
            middle = encoder.middle(tag, arr)
            if middle is None:
                return None
            length = fixed + len(middle) + arr.nbytes
            specs.append((arr.dtype, arr.shape))
            parts += (record_header(length), None, middle, None, None)
            starts.append(offset)
            lengths.append(length + RECORD_OVERHEAD)
            payloads.append(slice(offset + HEADER_SIZE, offset + HEADER_SIZE + length))
            offset += length + RECORD_OVERHEAD
        return cls(tags, list(map(type, arrays)), specs, parts, starts, lengths, payloads)

    def fits(self, arrays):
        """Whether ``arrays`` have the dtypes and shapes the template was made for."""
        # One C-level pass over the types; per-record dtype and shape reads (~0.3 us each)
        # only for arrays: a step of reductions is all numpy scalars.
        return self.types == list(map(type, arrays)) and (
            self.specs is None or self.specs == list(map(_DTYPE_AND_SHAPE, arrays)))

    def join(self, encoder, arrays):
        """The records of ``arrays`` at ``encoder``'s step, as one bytes object."""
        parts = self.parts[:]
        count = len(arrays)
        parts[1::5] = [encoder.head] * count
        parts[3::5] = arrays  # raises BufferError/ValueError for a non-contiguous array
        parts[4::5] = [encoder.metadata_field + EVENT_FOOTER] * count
        return b"".join(parts)


class ScalarRunLayout:
    """The event-file bytes of a run of float64 scalar records (a
    :class:`~smdebug.storage.step_data.ScalarRun`), as a template for every step with the
    same tags (and head and metadata lengths).

    Its records differ from step to step only in the step's head and metadata bytes and in
    the 8 bytes of each value, at fixed offsets: a step copies the template, copies those
    bytes in (two row assignments, one row per record), and computes every record's CRC32C
    from the template's (CRC32C is affine:
    :func:`~smdebug.storage.format.records.crc32c_field_shares`), a few numpy calls for the run.
    """

    __slots__ = ("tags", "template", "head_len", "tail_len", "head_at", "tail_at", "starts", "lengths", "codes",
                 "zero_crcs", "distinct", "base_crcs", "index_templates")

    def __init__(self, encoder, tags):
        head_len, meta_len = len(encoder.head), len(encoder.metadata_field)
        zero = np.float64(0.0)
        parts, starts, middles = [], [], []
        offset = 0
        for tag in tags:
            middle = encoder.middle(tag, zero)
            if middle is None:
                raise ValueError(f"tag {tag!r} cannot be written as a small record")
            length = head_len + len(middle) + 8 + meta_len
            parts += (record_header(length), bytes(head_len), middle, bytes(8 + meta_len), EVENT_FOOTER)
            starts.append(offset)
            middles.append(len(middle))
            offset += length + RECORD_OVERHEAD
        self.tags = tags
        self.template = np.frombuffer(b"".join(parts), np.uint8)
        starts = np.array(starts, np.intp)
        payload_at = starts + HEADER_SIZE
        payload_len = head_len + np.array(middles, np.intp) + 8 + meta_len
        self.starts = starts.tolist()
        self.lengths = (payload_len + RECORD_OVERHEAD).tolist()
        # Where each record's head, and its value followed by the metadata (its tail), start.
        self.head_len, self.tail_len = head_len, 8 + meta_len
        self.head_at = payload_at
        self.tail_at = payload_at + head_len + np.array(middles, np.intp)
        # CRC32C of each payload with zeros in head, value and metadata (once), and what the
        # head adds for each payload length (once a step: a handful of lengths).
        self.base_crcs = np.array([crc32c(self.template[a:a + n]) for a, n in zip(payload_at.tolist(),
                                                                                  payload_len.tolist())], np.uint32)
        self.distinct, self.codes = np.unique(payload_len, return_inverse=True)
        self.distinct = self.distinct.tolist()
        self.zero_crcs = [crc32c(bytes(n)) for n in self.distinct]
        self.index_templates = {}

    def fill(self, encoder, values):
        """The run's records at ``encoder``'s step as a uint8 array, and their payload CRC32Cs."""
        head, meta = encoder.head, encoder.metadata_field
        if len(head) != self.head_len or 8 + len(meta) != self.tail_len:
            raise ValueError("the step's head or metadata length differs from the template's")
        value_bytes = values.view(np.uint8).reshape(-1, 8)
        tail = np.empty((len(value_bytes), self.tail_len), np.uint8)
        tail[:, :8] = value_bytes
        tail[:, 8:] = np.frombuffer(meta, np.uint8)
        data = self.template.copy()
        # A row per record (a few times faster than an index per byte).
        _windows(data, self.head_len)[self.head_at] = np.frombuffer(head, np.uint8)
        _windows(data, self.tail_len)[self.tail_at] = tail
        # The head's share depends on the payload's length (a handful), the metadata's on
        # nothing (it ends every payload), the values' on each value.
        head_shares = np.array([crc32c(head + bytes(n - len(head))) ^ z for n, z in zip(self.distinct, self.zero_crcs)],
                               np.uint32)
        meta_share = crc32c(meta) ^ crc32c(bytes(len(meta))) if meta else 0
        crcs = crc32c_field_shares(value_bytes, len(meta))
        crcs ^= self.base_crcs
        crcs ^= head_shares[self.codes]
        crcs ^= meta_share
        return data, crcs

    def index_template(self, base):
        return _index_template(self.index_templates, self.tags, self.starts, self.lengths, base)

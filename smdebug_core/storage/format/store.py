"""The run store layout (docs/format.md section 10): where its files live and what their
columns are. The writer (``writer/store_sink.py``) and the reader
(``analysis/trials/store_index.py``) both take names and schemas from here, nowhere else.

A run in this layout keeps the collections files and the end-of-job marker of section 1,
and replaces ``events/`` and ``index/`` with ``store/``::

    store/_layout.json                                   {"layout": "store", "version": 1}
    store/statistics/worker=<w>/part-<segment>.parquet   one row per scalar or reduction value
    store/tensors/worker=<w>/part-<segment>.parquet      one row per whole tensor (where its record is)
    store/chunks/worker=<w>/<segment>-<chunk>.events     whole tensors, in the record framing of section 2
    store/live/worker=<w>/<segment>.arrows               the segment being written (Arrow IPC stream)

A *segment* is a bounded run of one worker's steps. While it is written its rows are
appended to its live file, one Arrow record batch per flush, each batch holding whole steps.
When it rolls, its chunks are closed, its ``tensors`` then its ``statistics`` Parquet files
are published (the latter is the seal), and the live file is removed. So at any instant a
segment is sealed (its statistics file exists: read the Parquet files) or live (read the
batches of its live file that are complete), and a reader never sees half a step.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple
from urllib.parse import quote, unquote

import numpy as np

from ...layouts import LAYOUT_1034, LAYOUTS, LAYOUT_ENV, STORE_LAYOUT, validate_layout  # noqa: F401

STORE_VERSION = 1

STORE_DIR = "store"
LAYOUT_FILE = f"{STORE_DIR}/_layout.json"
STATISTICS_DIR = f"{STORE_DIR}/statistics"
TENSORS_DIR = f"{STORE_DIR}/tensors"
CHUNKS_DIR = f"{STORE_DIR}/chunks"
LIVE_DIR = f"{STORE_DIR}/live"
PARQUET_SUFFIX = ".parquet"
LIVE_SUFFIX = ".arrows"
CHUNK_SUFFIX = ".events"
#: Every segment number has this many digits, so that names sort in segment order.
SEGMENT_DIGITS = 6
MAX_SEGMENT = 10**SEGMENT_DIGITS - 1

#: ``reduction`` of a row that is a scalar's own value (a loss, a metric), not a reduction.
OWN_VALUE = ""
#: ``kind`` of a tensors row: a record in a chunk, or only a shape (no record).
KIND_VALUE = "value"
KIND_SHAPE = "shape"

_PART = re.compile(r"part-([0-9]{%d})\.parquet" % SEGMENT_DIGITS)
_LIVE = re.compile(r"([0-9]{%d})\.arrows" % SEGMENT_DIGITS)


def worker_dir(worker: str) -> str:
    """The Hive partition folder of a worker, ``worker=<name>`` (percent-encoded as Hive does)."""
    return "worker=" + quote(worker, safe="_-.:@+,")


def worker_of_dir(name: str) -> Optional[str]:
    """The worker a partition folder names, or None if it is not one."""
    if not name.startswith("worker=") or len(name) <= len("worker="):
        return None
    return unquote(name[len("worker="):])


def statistics_relpath(worker: str, segment: int) -> str:
    return f"{STATISTICS_DIR}/{worker_dir(worker)}/part-{segment:0{SEGMENT_DIGITS}d}{PARQUET_SUFFIX}"


def tensors_relpath(worker: str, segment: int) -> str:
    return f"{TENSORS_DIR}/{worker_dir(worker)}/part-{segment:0{SEGMENT_DIGITS}d}{PARQUET_SUFFIX}"


def chunk_relpath(worker: str, segment: int, chunk: int) -> str:
    return f"{CHUNKS_DIR}/{worker_dir(worker)}/{segment:0{SEGMENT_DIGITS}d}-{chunk:03d}{CHUNK_SUFFIX}"


def live_relpath(worker: str, segment: int) -> str:
    return f"{LIVE_DIR}/{worker_dir(worker)}/{segment:0{SEGMENT_DIGITS}d}{LIVE_SUFFIX}"


def segment_of_part(name: str) -> Optional[int]:
    """The segment number of a ``part-<segment>.parquet`` file name, or None."""
    m = _PART.fullmatch(name)
    return int(m.group(1)) if m else None


def segment_of_live(name: str) -> Optional[int]:
    """The segment number of a ``<segment>.arrows`` file name, or None."""
    m = _LIVE.fullmatch(name)
    return int(m.group(1)) if m else None


def _schemas():
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    statistics = pa.schema([
        ("step", pa.int64()),
        ("mode", text),
        ("mode_step", pa.int64()),
        ("tensor", text),
        ("reduction", text),
        ("value", pa.float64()),
        # The stored value's numpy dtype and rank (0: shape (), 1: shape (1,)): a value reads
        # back as the same array it was saved as.
        ("dtype", text),
        ("ndim", pa.int8()),
        ("wall_time", pa.float64()),
    ])
    tensors = pa.schema([
        ("step", pa.int64()),
        ("mode", text),
        ("mode_step", pa.int64()),
        ("tensor", text),  # the record's name (a reduction's record name for reductions kept whole)
        ("kind", text),  # KIND_VALUE or KIND_SHAPE
        ("file", text),  # the chunk, relative to the run directory; null for a shape
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("crc32c", pa.int64()),  # of the record's payload
        ("dtype", text),
        ("shape", pa.list_(pa.int64())),
        ("original_name", pa.string()),  # of a shape entry, when the framework named it differently
        ("placement", pa.string()),  # JSON: where a piece of a sharded tensor lies (docs/format.md 3.3)
        ("wall_time", pa.float64()),
    ])
    # A live file holds both tables' rows: one file, so one batch holds whole steps.
    live_fields = {f.name: f for f in statistics}
    live_fields.update({f.name: f for f in tensors})
    live = pa.schema([("table", pa.int8())] + list(live_fields.values()))
    return statistics, tensors, live


_SCHEMAS: Optional[Tuple] = None


def schemas():
    """``(statistics, tensors, live)`` pyarrow schemas."""
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = _schemas()
    return _SCHEMAS


#: ``table`` column of a live row.
LIVE_STATISTICS, LIVE_TENSORS = 0, 1

#: Parquet settings of sealed files: zstd (level 1: level 3 took 40% more time for 0.3% fewer
#: bytes), float values split by byte before compression (their exponent bytes compress
#: together), dictionaries and min/max statistics only where they serve (the others cost time).
PARQUET_OPTIONS = dict(compression="zstd", compression_level=1, use_byte_stream_split=["value"],
                       use_dictionary=["mode", "tensor", "reduction", "dtype", "kind", "file"],
                       write_statistics=["step", "mode_step"])

# numpy dtypes whose single values a float64 holds exactly (integers: up to 2**53).
_EXACT_FLOAT = frozenset(np.dtype(t) for t in ("float16", "float32", "float64"))
_INT_KINDS = frozenset("iub")
_MAX_EXACT_INT = 2**53


def statistic_dtype(value) -> Optional[np.dtype]:
    """The dtype under which ``value`` goes into the statistics table, or None when it must
    stay a whole record: it must be one number of shape ``()`` or ``(1,)`` that a float64
    holds exactly."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(value, "size", 0) != 1 or getattr(value, "ndim", 2) > 1:
        return None
    if dtype in _EXACT_FLOAT:
        return dtype
    if dtype.kind in _INT_KINDS:
        item = int(value.item() if hasattr(value, "item") else value)
        return dtype if -_MAX_EXACT_INT <= item <= _MAX_EXACT_INT else None
    if dtype.name == "bfloat16":
        return dtype
    return None

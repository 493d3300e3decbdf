"""The run store's files as columns (docs/format.md 10): the limits a reader holds them to
(docs/reader_safety.md), arrow columns turned into numpy ones (texts as ids into the trial's
interners), and the complete batches of a live Arrow IPC stream. Used by store_index.py."""
from __future__ import annotations


import numpy as np

from ...modes import ModeKeys
from .record_log import _Interner


#: The largest store file read (a segment's Parquet or live file).
MAX_STORE_FILE_BYTES = 1 << 30
#: The largest Parquet footer (file metadata) read; a segment's is a few KiB.
MAX_PARQUET_FOOTER_BYTES = 16 << 20
#: The most rows one segment file may declare (the writer rolls at 2 million).
MAX_SEGMENT_FILE_ROWS = 16_000_000
#: The most bytes a Parquet file's columns may declare uncompressed.
MAX_DECLARED_UNCOMPRESSED_BYTES = 2 << 30

MODE_BY_VALUE = {m.value: m for m in ModeKeys}
MODE_VALUE_BY_NAME = {m.name: m.value for m in ModeKeys}
STAT_STEP_COLUMNS = ("step", "mode", "mode_step")
STAT_VALUE_COLUMNS = ("tensor", "reduction", "value", "dtype", "ndim")
TENSOR_COLUMNS = ("step", "mode", "mode_step", "tensor", "kind", "file", "offset", "length", "crc32c", "dtype", "shape",
                   "placement")


class StoreFileError(Exception):
    """A store file that cannot be used (its segment is left out)."""



def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return pa.types.is_string(arrow_type.value_type) or pa.types.is_large_string(arrow_type.value_type)
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def check_columns(schema, names, where: str) -> None:
    """StoreFileError unless ``schema`` has ``names`` with the kinds the store writes."""
    import pyarrow as pa

    for name in names:
        index = schema.get_field_index(name)
        if index < 0:
            raise StoreFileError(f"{where}: no column {name!r}")
        t = schema.field(index).type
        if name in ("mode", "tensor", "reduction", "dtype", "kind", "file", "placement", "original_name"):
            ok = _is_text(t)
        elif name == "value":
            ok = pa.types.is_floating(t)
        elif name == "shape":
            ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
        else:
            ok = pa.types.is_integer(t)
        if not ok:
            raise StoreFileError(f"{where}: column {name!r} has type {t}, not what the store writes")


def text_ids(column, interner: _Interner, where: str) -> np.ndarray:
    """A text column (dictionary-encoded or not, one chunk or several) as int32 ids into ``interner``."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        chunks = column.chunks
    else:
        chunks = [column]
    out = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        if chunk.null_count:
            raise StoreFileError(f"{where}: a text column holds nulls")
        dictionary = chunk.dictionary.to_pylist()
        lookup = np.asarray(interner.ids_of(dictionary), np.int32)
        indices = _chunk_numbers(chunk.indices, np.int32)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(lookup)):
            raise StoreFileError(f"{where}: a text column's codes lie outside its dictionary")
        if np.array_equal(lookup, np.arange(len(lookup), dtype=np.int32)):
            # The writer's codes are ours (its dictionary is its names in order of first sight, as
            # our interner's): no gather.
            out.append(np.asarray(indices, np.int32))
        else:
            out.append(lookup[indices])
    if not out:
        return np.zeros(0, np.int32)
    return np.concatenate(out) if len(out) != 1 else out[0]


def mode_values(column, where: str) -> np.ndarray:
    """A mode-name column as ModeKeys values (int8)."""
    names = _Interner()
    ids = text_ids(column, names, where)
    try:
        lookup = np.asarray([MODE_VALUE_BY_NAME[n] for n in names.items], np.int8)
    except KeyError as exc:
        raise StoreFileError(f"{where}: unknown mode {exc.args[0]!r}") from None
    return lookup[ids] if len(ids) else np.zeros(0, np.int8)


_ARROW_TYPES = {}


def _chunk_numbers(chunk, dtype) -> np.ndarray:
    """One arrow array without nulls as numpy, through its data buffer (pyarrow's to_numpy
    imports pandas: a quarter of a second at a trial's opening)."""
    import pyarrow as pa

    dtype = np.dtype(dtype)
    target = _ARROW_TYPES.get(dtype)
    if target is None:
        target = _ARROW_TYPES[dtype] = pa.from_numpy_dtype(dtype)
    if chunk.type != target:
        chunk = chunk.cast(target)
    if not len(chunk):
        return np.zeros(0, dtype)
    return np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * dtype.itemsize)


def number_column(column, dtype) -> np.ndarray:
    """A numeric column (an arrow array or chunked array, no nulls) as numpy."""
    chunks = getattr(column, "chunks", None)
    if chunks is None:
        return _chunk_numbers(column, dtype)
    if len(chunks) == 1:
        return _chunk_numbers(chunks[0], dtype)
    if not chunks:
        return np.zeros(0, dtype)
    return np.concatenate([_chunk_numbers(c, dtype) for c in chunks])


def int_column(column, where: str, dtype=np.int64) -> np.ndarray:
    if column.null_count:
        raise StoreFileError(f"{where}: an integer column holds nulls")
    return number_column(column, dtype)


def step_triples(steps: np.ndarray, modes: np.ndarray, mode_steps: np.ndarray):
    """The distinct steps of rows that come step by step, with the mode and mode step of
    each step's first row."""
    if not len(steps):
        return steps, modes, mode_steps
    change = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    s, m, ms = steps[change], modes[change], mode_steps[change]
    if len(s) > 1 and not (s[1:] > s[:-1]).all():
        s, first = np.unique(s, return_index=True)
        m, ms = m[first], ms[first]
    return s, m, ms

"""What a run store says (docs/format.md section 10), read incrementally: the reader of the
``store`` layout, in place of the index files' :class:`~.run_index.RunIndex`.

A run store holds, per worker and segment, a ``statistics`` Parquet file (one row per scalar
or reduction value, the value inline), a ``tensors`` Parquet file (where each whole tensor's
record lies in the segment's chunk files) and, while the segment is written, a live Arrow
IPC file holding the same rows batch by batch (storage/format/store.py). A segment whose
statistics file exists is sealed: its Parquet files are read once and never again; a live
segment's file is read again when it has grown, its complete batches only.

What is kept is columns, not per-value objects:

* per segment (:class:`_Part`) numpy columns of its statistics rows (``step``, ``mode``,
  ``mode_step`` when it is registered; ``tensor``, ``label``, ``value``, ``dtype``,
  ``ndim`` when first needed) and its tensors rows;
* a tensor's :class:`~.locations.TensorRecords` (what ``Tensor`` reads) is built from them
  when the tensor is first asked for (``tensors[name]``), values as
  :class:`~.locations.InlineValue` (no record to read), whole tensors as
  :class:`~.locations.TensorLocation` s into the chunk files, which the trial's
  ``RecordReader`` reads as it reads event files;
* ``Trial.to_table`` takes its rows straight from the columns (:meth:`StoreIndex.table`).

Rows for the same (worker, step, tensor, reduction) seen again later (the flight recorder
writing a step anew, a late scalar) replace the earlier ones, as later index entries do.

Untrusted input (docs/reader_safety.md): files are read through the trial's storage (regular
files inside the run, bounded sizes); a Parquet footer, a row count or a declared
uncompressed size beyond the limits below, a file that does not parse, or columns of the
wrong kind cost that file's segment, with one warning naming the file, never the trial.
"""
from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from ...exceptions import IndexReaderException, UnsafeRunFile
from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag
from ...storage.format import store
from ...storage.format.index import _parse_placements
from .labels import reduction_label
from .locations import InlineValue, TensorLocation, TensorRecords
from .paths import worker_from_name
from .record_log import _Interner
from .steps import StepIndex

logger = logging.getLogger("smdebug.trials")

#: The largest store file read (a segment's Parquet or live file).
MAX_STORE_FILE_BYTES = 1 << 30
#: The largest Parquet footer (file metadata) read; a segment's is a few KiB.
MAX_PARQUET_FOOTER_BYTES = 16 << 20
#: The most rows one segment file may declare (the writer rolls at 2 million).
MAX_SEGMENT_FILE_ROWS = 16_000_000
#: The most bytes a Parquet file's columns may declare uncompressed.
MAX_DECLARED_UNCOMPRESSED_BYTES = 2 << 30

_MODE_BY_VALUE = {m.value: m for m in ModeKeys}
_MODE_VALUE_BY_NAME = {m.name: m.value for m in ModeKeys}
_STAT_STEP_COLUMNS = ("step", "mode", "mode_step")
_STAT_VALUE_COLUMNS = ("tensor", "reduction", "value", "dtype", "ndim")
_TENSOR_COLUMNS = ("step", "mode", "mode_step", "tensor", "kind", "file", "offset", "length", "crc32c", "dtype", "shape",
                   "placement")


class StoreFileError(Exception):
    """A store file that cannot be used (its segment is left out)."""


# ---------------------------------------------------------------------------- columns
def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return pa.types.is_string(arrow_type.value_type) or pa.types.is_large_string(arrow_type.value_type)
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _check_columns(schema, names, where: str) -> None:
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


def _texts(column, interner: _Interner, where: str) -> np.ndarray:
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


def _modes(column, where: str) -> np.ndarray:
    """A mode-name column as ModeKeys values (int8)."""
    names = _Interner()
    ids = _texts(column, names, where)
    try:
        lookup = np.asarray([_MODE_VALUE_BY_NAME[n] for n in names.items], np.int8)
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


def _numbers(column, dtype) -> np.ndarray:
    """A numeric column (an arrow array or chunked array, no nulls) as numpy."""
    chunks = getattr(column, "chunks", None)
    if chunks is None:
        return _chunk_numbers(column, dtype)
    if len(chunks) == 1:
        return _chunk_numbers(chunks[0], dtype)
    if not chunks:
        return np.zeros(0, dtype)
    return np.concatenate([_chunk_numbers(c, dtype) for c in chunks])


def _ints(column, where: str, dtype=np.int64) -> np.ndarray:
    if column.null_count:
        raise StoreFileError(f"{where}: an integer column holds nulls")
    return _numbers(column, dtype)


def _step_triples(steps: np.ndarray, modes: np.ndarray, mode_steps: np.ndarray):
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


# ---------------------------------------------------------------------------- segments
class _Part:
    """One worker's segment as read so far: statistics rows in columns, tensors rows as tuples."""

    def __init__(self, folder: str, worker: str, worker_id: int, number: int):
        self.folder = folder  # the worker as the store's folders name it
        self.worker = worker  # as the trial names it (a TensorFlow device name deserialized)
        self.worker_id = worker_id
        self.number = number
        self.sealed = False
        self.source = ""  # the file its rows came from, relative to the run
        self.live_size = -1  # bytes of the live file when it was read
        self.version = 0
        self.set_rows(np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64), None, [])

    def set_rows(self, step, mode, mode_step, rest, tensor_rows) -> None:
        """New contents. ``rest``: the other statistics columns, or a function giving them
        (read when first needed). ``tensor_rows``: ``(step, mode, mode_step, record name, kind,
        file, offset, length, crc32c, dtype, shape, placement)``."""
        self.step, self.mode, self.mode_step = step, mode, mode_step
        self._rest = rest
        self.loaded = not callable(rest)
        if self.loaded:
            self._take(rest)
        self.tensor_rows = tensor_rows
        self.version += 1
        self._groups = None
        self._template = None
        self._blocks = None
        self._present = None
        self._mode_present: Dict[int, np.ndarray] = {}
        lo = [int(step.min())] if len(step) else []
        hi = [int(step.max())] if len(step) else []
        if tensor_rows:
            t_steps = [r[0] for r in tensor_rows]
            lo.append(min(t_steps))
            hi.append(max(t_steps))
        self.lo = min(lo) if lo else None
        self.hi = max(hi) if hi else None

    def _take(self, rest) -> None:
        if rest is None:
            n = len(self.step)
            rest = (np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n), np.zeros(n, np.int32),
                    np.zeros(n, np.int8))
        self.tensor, self.label, self.value, self._dtype, self._ndim = rest

    # A sealed segment's dtype and ndim columns are read only when a value is made from a row
    # (tables need neither): ``_dtype`` is then None and ``_types`` the function that reads them.
    @property
    def dtype(self) -> np.ndarray:
        if self._dtype is None:
            self._load_types()
        return self._dtype

    @property
    def ndim(self) -> np.ndarray:
        if self._ndim is None:
            self._load_types()
        return self._ndim

    def _load_types(self) -> None:
        reader, self._types = getattr(self, "_types", None), None
        found = reader() if reader is not None else None
        if found is None:  # the file failed now (warned): numbers as float64 of shape ()
            found = (np.zeros(len(self.step), np.int32), np.zeros(len(self.step), np.int8))
        self._dtype, self._ndim = found

    def read_rest(self):
        """What :meth:`load` needs read from the file (any thread), or None."""
        reader = getattr(self._rest, "read", None) if not self.loaded else None
        return reader() if reader is not None else None

    def load(self, read=None) -> None:
        """Read the columns left for later (``read``: :meth:`read_rest`'s result); a file that
        fails now (it was warned about) leaves the segment without statistics rows."""
        if not self.loaded:
            rest, self._rest = self._rest, None
            columns = rest() if read is None else rest(read)
            if columns is None:
                self.step, self.mode, self.mode_step = self.step[:0], self.mode[:0], self.mode_step[:0]
            self._take(columns)
            self.loaded = True

    def __len__(self):
        return len(self.step)

    def blocks(self, templates) -> Optional["_Blocks"]:
        """The segment step by step (:class:`_Blocks`), or None; ``templates``: the index's
        :meth:`StoreIndex.template_of`."""
        if self._blocks is None:
            self._blocks = _find_blocks(self, templates) or False
        return self._blocks or None

    def template(self) -> Optional["_Template"]:
        """The segment's rows as ``blocks x width`` when every step holds the same (tensor,
        label) sequence, once each, steps increasing (the usual segment); else None."""
        if self._template is None:
            self._template = _find_template(self) or False
        return self._template or None

    def rows_of(self, tensor_id: int) -> np.ndarray:
        """Indices of the statistics rows of a tensor, in row order."""
        template = self.template()
        if template is not None:
            where = np.flatnonzero(template.tensor == tensor_id)
            if not len(where):
                return where
            return (np.arange(template.blocks)[:, None] * template.width + where[None, :]).reshape(-1)
        if self._groups is None:
            t = self.tensor
            size = int(t.max()) + 1 if len(t) else 0
            order = np.argsort(t.astype(np.uint16) if size <= 1 << 16 else t, kind="stable")
            bounds = np.zeros(size + 1, np.int64)
            np.cumsum(np.bincount(t, minlength=size), out=bounds[1:])
            self._groups = (order, bounds)
        order, bounds = self._groups
        if tensor_id + 1 >= len(bounds):
            return order[:0]
        return order[bounds[tensor_id]:bounds[tensor_id + 1]]

    def present(self, mode: Optional[int] = None) -> np.ndarray:
        """The tensor ids with statistics rows (of one mode, when given)."""
        if mode is None:
            if self._present is None:
                self._present = np.flatnonzero(np.bincount(self.tensor)) if len(self.tensor) else self.tensor[:0]
            return self._present
        found = self._mode_present.get(mode)
        if found is None:
            t = self.tensor[self.mode == mode]
            found = self._mode_present[mode] = np.flatnonzero(np.bincount(t)) if len(t) else t[:0]
        return found


class _Template:
    """A segment whose ``blocks`` steps each hold the same ``width`` rows: (``tensor``,
    ``label``) at each position, and each block's ``step``, ``mode`` and ``mode_step``."""

    def __init__(self, blocks, width, tensor, label, step, mode, mode_step):
        self.blocks, self.width = blocks, width
        self.tensor, self.label = tensor, label
        self.step, self.mode, self.mode_step = step, mode, mode_step

    def same_rows(self, other: "_Template") -> bool:
        return np.array_equal(self.tensor, other.tensor) and np.array_equal(self.label, other.label)


class _Blocks:
    """A segment's statistics rows step by step: block ``b`` (rows ``start[b]:start[b+1]``) holds
    step ``step[b]`` (increasing), one ``mode`` and ``mode_step``, and the (tensor, label)
    sequence of template ``template[b]`` (:meth:`StoreIndex.template_of`), no pair twice."""

    def __init__(self, start, step, mode, mode_step, template):
        self.start, self.step, self.mode, self.mode_step, self.template = start, step, mode, mode_step, template


def _find_blocks(part: _Part, templates) -> Optional[_Blocks]:
    """The segment's :class:`_Blocks`, or None when its rows are not so (a step written twice,
    steps out of order, a pair twice in a step). ``templates``: ``(tensor, label) -> id``."""
    n = len(part)
    if not n:
        return None
    s = part.step
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    steps = s[start]
    if len(steps) > 1 and not (steps[1:] > steps[:-1]).all():
        return None
    widths = np.diff(np.r_[start, n])
    for column in (part.mode, part.mode_step):
        if not (column == np.repeat(column[start], widths)).all():
            return None
    tensor, label = part.tensor, part.label
    ids = np.empty(len(start), np.int64)
    bounds = np.r_[start, n].tolist()
    for b in range(len(start)):
        a, e = bounds[b], bounds[b + 1]
        found = templates(tensor[a:e], label[a:e])
        if found is None:
            return None
        ids[b] = found
    return _Blocks(np.r_[start, n], steps, part.mode[start], part.mode_step[start], ids)


def _find_template(part: _Part) -> Optional[_Template]:
    n = len(part)
    if not n:
        return None
    s = part.step
    change = np.flatnonzero(s[1:] != s[:-1]) + 1
    blocks = len(change) + 1
    if n % blocks:
        return None
    width = n // blocks
    if blocks > 1 and not np.array_equal(change, np.arange(width, n, width)):
        return None
    steps = s[::width]
    if blocks > 1 and not (steps[1:] > steps[:-1]).all():
        return None
    t = part.tensor.reshape(blocks, width)
    label = part.label.reshape(blocks, width)
    mode = part.mode.reshape(blocks, width)
    mode_step = part.mode_step.reshape(blocks, width)
    if not ((t == t[:1]).all() and (label == label[:1]).all() and (mode == mode[:, :1]).all()
            and (mode_step == mode_step[:, :1]).all()):
        return None
    pairs = t[0].astype(np.int64) * (int(label[0].max()) + 1) + label[0]
    if len(np.unique(pairs)) != width:  # a (tensor, label) twice in a step: the later wins, not this way
        return None
    return _Template(blocks, width, t[0].copy(), label[0].copy(), steps.copy(), mode[:, 0].copy(),
                     mode_step[:, 0].copy())


# ---------------------------------------------------------------------------- the index
class StoreIndex:
    """The run store of one run read so far (the interface of :class:`~.run_index.RunIndex`).

    ``range_steps``: ``(begin, end)`` or None, the global steps to load. ``stats``: the
    trial's counters. ``steps``: the trial's :class:`StepIndex` (a new one by default).
    """

    def __init__(self, storage, range_steps, stats: Dict[str, int], steps: Optional[StepIndex] = None):
        from .table import require_optional

        # The store needs it: ImportError now, naming what to install, not at the first value.
        require_optional("pyarrow.parquet", "reading a run store (store/)", "pyarrow", "parquet")

        self.storage = storage
        self.range_steps = range_steps
        self.stats = stats
        self.steps = steps if steps is not None else StepIndex()
        self.names = _Interner()  # tensor names (a reduction's tensor, not its record name)
        self.labels = _Interner([""])  # "" a tensor's own value, else "l2", "abs_max"...
        self.workers = _Interner()
        self.dtypes = _Interner()
        self.tensors = _Catalog(self)
        self.tensors_for_step = _StepNames(self)
        self.tensors_for_mode = _ModeNames(self)
        self.corrupt_index_files: List[str] = []  # store files skipped, relative to the run
        self._parts: Dict[Tuple[str, int], _Part] = {}
        self._sealed_seen: Set[str] = set()  # statistics files read (or skipped for good)
        self._warned: Set[str] = set()
        self._dir_mtime: Dict[str, int] = {}
        self._names_cache: Optional[Dict[str, None]] = None
        self._tensor_row_names: Dict[str, Tuple[str, Optional[Tuple[str, bool]]]] = {}
        self._label_keys: List[Tuple[str, bool]] = [("", False)]
        self._log = None
        self._template_ids: Dict[Tuple[bytes, bytes], int] = {}
        self.templates: List[Tuple[np.ndarray, np.ndarray]] = []
        self._template_tensors: Dict[int, List[int]] = {}

    # ------------------------------------------------------------------ listing and reading
    def read_new(self, progress: Optional[bool] = None) -> int:
        """Read the segments sealed, and the live files grown, since the last call; returns how
        many files were read. Remote runs: sealed segments only."""
        remote = getattr(self.storage, "remote", False)
        # Live files first: a segment sealed between the two listings is then found sealed.
        live = [] if remote else self._list(store.LIVE_DIR, store.segment_of_live)
        sealed = self._list(store.STATISTICS_DIR, store.segment_of_part, skip_unchanged=not remote)
        changed: List[_Part] = []
        files = 0
        for worker, number, relpath in sealed:
            if relpath in self._sealed_seen:
                continue
            self._sealed_seen.add(relpath)
            part = self._read_sealed(worker, number, relpath)
            files += 1
            if part is not None:
                changed.append(part)
        for worker, number, relpath in live:
            part = self._parts.get((worker, number))
            if part is not None and part.sealed:
                continue
            if store.statistics_relpath(worker, number) in self._sealed_seen:
                continue  # sealed after the listing (or its Parquet was refused: it was warned about)
            part = self._read_live(worker, number, relpath, part)
            if part is not None:
                files += 1
                changed.append(part)
        if changed:
            self._changed(changed)
        return files

    def _list(self, directory: str, parse, skip_unchanged: bool = False) -> List[Tuple[str, int, str]]:
        """``(worker, segment, relpath)`` of the files of ``directory``'s worker folders."""
        out = []
        for entry in self.storage.list_dir(directory):
            worker = store.worker_of_dir(entry.name) if entry.is_dir else None  # as its files are named
            if worker is None:
                continue
            folder = f"{directory}/{entry.name}"
            if skip_unchanged and entry.mtime_ns:
                # A folder whose time did not move since we listed it holds nothing new; one that
                # changed in the last two seconds is listed again (coarse directory times).
                if self._dir_mtime.get(folder) == entry.mtime_ns and \
                        os.stat(self.storage.local_path(folder)).st_mtime_ns == entry.mtime_ns and \
                        _age_ns(entry.mtime_ns) > 2_000_000_000:
                    continue
                self._dir_mtime[folder] = entry.mtime_ns
            for item in self.storage.list_dir(folder):
                number = None if item.is_dir else parse(item.name)
                if number is not None:
                    out.append((worker, number, f"{folder}/{item.name}"))
        out.sort(key=lambda x: (x[0], x[1]))
        return out

    def _warn(self, relpath: str, reason: str, what: str = "its segment is left out of the trial") -> None:
        if relpath not in self._warned:
            self._warned.add(relpath)
            self.corrupt_index_files.append(relpath)
            logger.warning("smdebug: run store file %s skipped, %s: %s", self.storage.local_path(relpath), what,
                           reason)

    def _part(self, folder: str, number: int) -> _Part:
        part = self._parts.get((folder, number))
        if part is None:
            worker = worker_from_name(folder)
            part = self._parts[(folder, number)] = _Part(folder, worker, self.workers.id(worker), number)
        return part

    def _in_range(self, lo: int, hi: int) -> bool:
        if self.range_steps is None:
            return True
        begin, end = self.range_steps
        return (begin is None or hi >= begin) and (end is None or lo < end)

    def _range_mask(self, steps: np.ndarray) -> Optional[np.ndarray]:
        if self.range_steps is None or not len(steps):
            return None
        begin, end = self.range_steps
        mask = np.ones(len(steps), bool)
        if begin is not None:
            mask &= steps >= begin
        if end is not None:
            mask &= steps < end
        return None if mask.all() else mask

    def _read_bytes(self, relpath: str) -> bytes:
        try:
            return self.storage.read_file(relpath, max_bytes=MAX_STORE_FILE_BYTES)
        except UnsafeRunFile as exc:
            raise StoreFileError(str(exc)) from None
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise StoreFileError(f"cannot be read: {exc.strerror or exc}") from None

    def _parquet(self, relpath: str, columns):
        """``(ParquetFile, handle)`` of a sealed file, its footer and declared sizes checked;
        the caller closes ``handle`` (None for a remote file, read whole). A local file is read
        in part: its footer and the columns asked for."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        opener = getattr(self.storage, "open_file", None)
        handle = None
        try:
            if opener is None:
                data = self._read_bytes(relpath)
                size, head, tail, source = len(data), data[:4], data[-8:], pa.BufferReader(data)
            else:
                try:
                    handle = opener(relpath, MAX_STORE_FILE_BYTES)
                except UnsafeRunFile as exc:
                    raise StoreFileError(str(exc)) from None
                fd = handle.fileno()
                size = os.fstat(fd).st_size
                head, tail = os.pread(fd, 4, 0), os.pread(fd, 8, max(0, size - 8))
                source = handle
            self.stats["index_files_parsed"] = self.stats.get("index_files_parsed", 0) + 1
            if size < 12 or head != b"PAR1" or tail[4:] != b"PAR1":
                raise StoreFileError(f"not a Parquet file ({size} bytes, no PAR1 marks at both ends: "
                                     "truncated or damaged)")
            footer = struct.unpack("<I", tail[:4])[0]
            if footer > MAX_PARQUET_FOOTER_BYTES or footer > size - 12:
                raise StoreFileError(f"its footer claims {footer} bytes (the file has {size}, the limit is "
                                     f"{MAX_PARQUET_FOOTER_BYTES})")
            try:
                pf = pq.ParquetFile(source)
                meta = pf.metadata
                if meta.num_rows > MAX_SEGMENT_FILE_ROWS or meta.num_rows < 0:
                    raise StoreFileError(f"it declares {meta.num_rows} rows (the limit is {MAX_SEGMENT_FILE_ROWS})")
                declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
                if declared > MAX_DECLARED_UNCOMPRESSED_BYTES:
                    raise StoreFileError(f"its columns declare {declared} bytes uncompressed (the limit is "
                                         f"{MAX_DECLARED_UNCOMPRESSED_BYTES})")
                _check_columns(pf.schema_arrow, columns, "its schema")
            except StoreFileError:
                raise
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise StoreFileError(f"not a readable Parquet file: {exc}") from None
        except BaseException:
            if handle is not None:
                handle.close()
            raise
        return pf, handle

    def _read_columns(self, relpath: str, columns, schema, rows: Optional[int] = None):
        """``columns`` of a sealed file whose schema must have ``schema``'s columns (``rows``:
        the rows it must hold) as an arrow table."""
        pf, handle = self._parquet(relpath, schema)
        try:
            if rows is not None and pf.metadata.num_rows != rows:
                raise StoreFileError(f"it now holds {pf.metadata.num_rows} rows, not the {rows} read before "
                                     "(replaced while the trial was open)")
            return pf.read(columns=list(columns))
        finally:
            if handle is not None:
                handle.close()

    def _read_sealed(self, worker: str, number: int, relpath: str) -> Optional[_Part]:
        """A sealed segment's Parquet files (statistics: steps now, values when first needed)."""
        import pyarrow as pa

        tensors_relpath = store.tensors_relpath(worker, number)
        where = relpath
        try:
            table = self._read_columns(relpath, _STAT_STEP_COLUMNS, _STAT_STEP_COLUMNS + _STAT_VALUE_COLUMNS)
            rows = table.num_rows
            step = _ints(table.column("step"), where)
            mode = _modes(table.column("mode"), where)
            mode_step = _ints(table.column("mode_step"), where)
        except FileNotFoundError:
            self._sealed_seen.discard(relpath)  # listed, then gone: look again next time
            return None
        except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
            live = self._parts.get((worker, number))
            self._warn(relpath, str(exc), "its segment is left out of the trial" if live is None else
                       "the rows its live file showed are kept")
            return None
        keep = self._range_mask(step)
        if keep is not None:
            step, mode, mode_step = step[keep], mode[keep], mode_step[keep]

        def rest(t=None, keep=keep, where=where, rows=rows):
            """The value columns; ``t``: their table, read already (:meth:`loaded_parts`)."""
            try:
                if t is None:
                    t = read_rest()
                if isinstance(t, Exception):
                    raise t
                columns = (_texts(t.column("tensor"), self.names, where),
                           _texts(t.column("reduction"), self.labels, where),
                           _numbers(t.column("value"), np.float64), None, None)
            except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
                self._warn(where, str(exc), "its values are left out of the trial")
                return None
            self._label_keys_update()
            return columns if keep is None else tuple(c if c is None else c[keep] for c in columns)

        def read_rest(where=where, rows=rows):
            """The value columns' table (or the exception that stopped it): safe in a thread."""
            try:
                return self._read_columns(where, _STAT_VALUE_COLUMNS[:3], _STAT_STEP_COLUMNS + _STAT_VALUE_COLUMNS, rows)
            except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
                return exc

        def read_types(where=where, rows=rows, keep=keep):
            """The dtype and ndim columns (None if the file fails now: warned)."""
            try:
                t = self._read_columns(where, ("dtype", "ndim"), _STAT_STEP_COLUMNS + _STAT_VALUE_COLUMNS, rows)
                columns = (_texts(t.column("dtype"), self.dtypes, where), _ints(t.column("ndim"), where, np.int8))
            except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
                self._warn(where, str(exc), "its values read back as float64")
                return None
            return columns if keep is None else tuple(c[keep] for c in columns)

        rest.read = read_rest
        tensor_rows = []
        try:
            tensor_rows = self._tensor_rows_parquet(tensors_relpath)
        except FileNotFoundError:
            self._warn(tensors_relpath, "it is missing (a segment's tensors file is written before its "
                                        "statistics file)", "its whole tensors are left out of the trial")
        except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
            self._warn(tensors_relpath, str(exc), "its whole tensors are left out of the trial")
        part = self._part(worker, number)
        part.sealed = True
        part.source = relpath
        part.set_rows(step, mode, mode_step, rest, tensor_rows)
        part._types = read_types
        return part

    def _tensor_rows_parquet(self, relpath: str) -> list:
        return self._tensor_rows(self._read_columns(relpath, _TENSOR_COLUMNS, _TENSOR_COLUMNS), relpath)

    def _tensor_rows(self, table, where: str) -> list:
        """A tensors table as row tuples (see :meth:`_Part.set_rows`)."""
        if not table.num_rows:
            return []
        step = _ints(table.column("step"), where).tolist()
        mode = _modes(table.column("mode"), where).tolist()
        mode_step = _ints(table.column("mode_step"), where).tolist()
        lists = [table.column(c).to_pylist() for c in ("tensor", "kind", "file", "offset", "length", "crc32c",
                                                       "dtype", "shape", "placement")]
        rows = []
        for row in zip(step, mode, mode_step, *lists):
            name, kind = row[3], row[4]
            if not isinstance(name, str) or kind not in (store.KIND_VALUE, store.KIND_SHAPE):
                raise StoreFileError(f"{where}: a row of kind {kind!r} for {name!r}")
            if kind == store.KIND_VALUE and (not isinstance(row[5], str) or row[6] is None or row[7] is None
                                             or row[6] < 0 or row[7] < 0):
                raise StoreFileError(f"{where}: the record of {name!r} at step {row[0]} has no place")
            if row[10] is not None and any(d is None or d < 0 for d in row[10]):
                raise StoreFileError(f"{where}: the shape of {name!r} at step {row[0]} is {row[10]}")
            rows.append(row)
        rows.sort(key=lambda r: r[0]) if any(a[0] > b[0] for a, b in zip(rows, rows[1:])) else None
        keep = self._range_mask(np.asarray([r[0] for r in rows], np.int64))
        if keep is not None:
            rows = [r for r, k in zip(rows, keep.tolist()) if k]
        return rows

    def _read_live(self, worker: str, number: int, relpath: str, part: Optional[_Part]) -> Optional[_Part]:
        """A live segment's complete batches, when its file is new or has grown."""
        import pyarrow as pa

        if relpath in self._warned:
            return None
        try:
            size = os.stat(self.storage.local_path(relpath)).st_size
        except OSError:
            return None
        if part is not None and part.live_size == size:
            return None
        try:
            data = self._read_bytes(relpath)
        except FileNotFoundError:
            return None  # sealed since the listing: the next refresh reads its Parquet
        except StoreFileError as exc:
            self._warn(relpath, str(exc))
            return None
        self.stats["index_files_parsed"] = self.stats.get("index_files_parsed", 0) + 1
        try:
            batches = _complete_batches(data, relpath)
            if not batches:
                if part is None:
                    part = self._part(worker, number)
                part.live_size = len(data)
                return None
            table = pa.Table.from_batches(batches)
            _check_columns(table.schema, ("table",) + _STAT_STEP_COLUMNS + _STAT_VALUE_COLUMNS + _TENSOR_COLUMNS,
                           relpath)
            which = _ints(table.column("table"), relpath, np.int8)
            stats = table.filter(pa.array(which == store.LIVE_STATISTICS))
            tensors = table.filter(pa.array(which == store.LIVE_TENSORS))
            step = _ints(stats.column("step"), relpath)
            mode = _modes(stats.column("mode"), relpath)
            mode_step = _ints(stats.column("mode_step"), relpath)
            rest = (_texts(stats.column("tensor"), self.names, relpath),
                    _texts(stats.column("reduction"), self.labels, relpath),
                    _numbers(stats.column("value"), np.float64),
                    _texts(stats.column("dtype"), self.dtypes, relpath),
                    _ints(stats.column("ndim"), relpath, np.int8))
            self._label_keys_update()
            tensor_rows = self._tensor_rows(tensors, relpath)
        except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
            self._warn(relpath, str(exc))
            return None
        keep = self._range_mask(step)
        if keep is not None:
            step, mode, mode_step = step[keep], mode[keep], mode_step[keep]
            rest = tuple(c[keep] for c in rest)
        if part is None:
            part = self._part(worker, number)
        part.source = relpath
        part.live_size = len(data)
        part.set_rows(step, mode, mode_step, rest, tensor_rows)
        return part

    def _label_keys_update(self) -> None:
        for label in self.labels.items[len(self._label_keys):]:
            is_abs = label.startswith("abs_")
            self._label_keys.append((label[4:] if is_abs else label, is_abs))

    # ------------------------------------------------------------------ registering
    def _changed(self, parts: List[_Part]) -> None:
        """Register the steps of new or grown segments; update what was built from them."""
        root = self.storage.root
        add = self.steps.add
        new_steps = False
        for part in parts:
            if not self._in_range(part.lo if part.lo is not None else 0, part.hi if part.hi is not None else 0) \
                    and part.lo is not None:
                continue
            s, m, ms = part.step, part.mode, part.mode_step
            if part.tensor_rows:
                rows = part.tensor_rows
                s = np.concatenate([s, np.asarray([r[0] for r in rows], np.int64)])
                m = np.concatenate([m, np.asarray([r[1] for r in rows], np.int8)])
                ms = np.concatenate([ms, np.asarray([r[2] for r in rows], np.int64)])
                order = np.argsort(s, kind="stable")
                s, m, ms = s[order], m[order], ms[order]
            steps, modes, mode_steps = _step_triples(s, m, ms)
            worker = part.worker
            for step, mode, mode_step in zip(steps.tolist(), modes.tolist(), mode_steps.tolist()):
                if add(step, worker, _MODE_BY_VALUE[mode], mode_step, root):
                    new_steps = True
        if new_steps:
            self.steps.forget_sorted()
        self._names_cache = None
        self._log = None
        self.tensors_for_step.clear()
        self.tensors_for_mode.clear()
        self.tensors.update(parts)

    def template_of(self, tensor: np.ndarray, label: np.ndarray) -> Optional[int]:
        """The id of a step's (tensor, label) sequence (ids kept for the trial's life), or None
        when a pair is in it twice; ``templates[id]`` is ``(tensor, label)``."""
        key = (tensor.tobytes(), label.tobytes())
        found = self._template_ids.get(key)
        if found is None:
            pairs = tensor.astype(np.int64) * (len(self.labels.items) + 1) + label
            if len(np.unique(pairs)) != len(pairs):
                return None
            found = self._template_ids[key] = len(self.templates)
            self.templates.append((tensor.copy(), label.copy()))
        return found

    def tensor_ids_at(self, part: _Part, step: int) -> List[int]:
        """The tensor ids of a segment's statistics rows at ``step``: its block's sequence when
        the segment goes step by step, else a scan."""
        blocks = part.blocks(self.template_of)
        if blocks is None:
            return np.unique(part.tensor[part.step == step]).tolist()
        b = int(np.searchsorted(blocks.step, step))
        if b == len(blocks.step) or blocks.step[b] != step:
            return []
        template = int(blocks.template[b])
        found = self._template_tensors.get(template)
        if found is None:
            found = self._template_tensors[template] = np.unique(self.templates[template][0]).tolist()
        return found

    def ordered_parts(self) -> List[_Part]:
        """Every segment read, worker by worker, in segment order (later rows win)."""
        return [self._parts[k] for k in sorted(self._parts)]

    def loaded_parts(self) -> List[_Part]:
        """:meth:`ordered_parts` with every column read (a segment whose values fail is emptied)."""
        parts = self.ordered_parts()
        pending = [p for p in parts if not p.loaded]
        threads = min(len(pending), os.cpu_count() or 1, 8)
        if threads > 1:
            # Decoding a column releases the GIL: the files are read side by side; their
            # texts are then interned here, in order.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                read = list(pool.map(_Part.read_rest, pending))
            for part, table in zip(pending, read):
                part.load(table)
        for part in pending:
            part.load()
        self._label_keys_update()
        return parts

    def tensor_row_name(self, record_name: str) -> Tuple[str, Optional[Tuple[str, bool]]]:
        """``(tensor, reduction key or None)`` of a record name of the tensors table."""
        found = self._tensor_row_names.get(record_name)
        if found is None:
            reduction = parse_reduction_tag(record_name) if REDUCTION_TAG_PREFIX in record_name else None
            found = (record_name, None) if reduction is None else (reduction[2], reduction[:2])
            self._tensor_row_names[record_name] = found
        return found

    def present_names(self) -> Dict[str, None]:
        """The names of every tensor with rows (in order of first sight)."""
        if self._names_cache is None:
            ids: Set[int] = set()
            names: Dict[str, None] = {}
            parts = self.loaded_parts()
            for part in parts:
                ids.update(part.present().tolist())
            items = self.names.items
            for i in sorted(ids):
                names[items[i]] = None
            for part in parts:
                for row in part.tensor_rows:
                    names[self.tensor_row_name(row[3])[0]] = None
            self._names_cache = names
        return self._names_cache

    def names_with_values(self) -> Set[str]:
        """The names of the tensors with a value of their own (not only reductions or shapes)."""
        ids: Set[int] = set()
        names: Set[str] = set()
        for part in self.loaded_parts():
            if len(part):
                ids.update(np.unique(part.tensor[part.label == 0]).tolist())
            names.update(self.tensor_row_name(r[3])[0] for r in part.tensor_rows
                         if r[4] == store.KIND_VALUE and self.tensor_row_name(r[3])[1] is None)
        names.update(self.names.items[i] for i in ids)
        return names

    def names_with_complete_step(self, candidates, is_complete) -> List[str]:
        """The names among ``candidates`` with a step that ``is_complete`` (by global step)."""
        last = self.steps.last_complete_step
        ids: Set[int] = set()
        names: Set[str] = set()
        for part in self.loaded_parts():
            if part.hi is not None and part.hi <= last:
                ids.update(part.present().tolist())
                names.update(self.tensor_row_name(r[3])[0] for r in part.tensor_rows)
                continue
            if len(part):
                steps = np.unique(part.step)
                done = steps[np.fromiter(map(is_complete, steps.tolist()), bool, len(steps))]
                ids.update(np.unique(part.tensor[np.isin(part.step, done)]).tolist())
            names.update(self.tensor_row_name(r[3])[0] for r in part.tensor_rows if is_complete(r[0]))
        items = self.names.items
        names.update(items[i] for i in ids)
        return [n for n in candidates if n in names]

    # ------------------------------------------------------------------ one tensor's records
    def _add_tensor_row(self, records: TensorRecords, worker: str, row, key, part: _Part) -> None:
        step, _, _, record_name, kind, file, offset, length, crc, _, shape, placement = row
        if kind == store.KIND_SHAPE:
            records.add_shape(step, worker, tuple(shape or ()))
            return
        location = TensorLocation(file, offset, length, crc, record_name)
        if key is None:
            records.add_value(step, worker, location)
        else:
            records.add_reduction(step, worker, key, location)
        if placement is not None and key is None:
            try:
                parsed = _parse_placements(part.source, {record_name: json.loads(placement)})
            except (IndexReaderException, ValueError, RecursionError) as exc:
                if part.source not in self._warned:
                    self._warned.add(part.source)
                    logger.warning("smdebug: a placement in %s is left out: %s",
                                   self.storage.local_path(part.source), exc)
                return
            records.add_placement(step, worker, parsed[record_name])

    # ------------------------------------------------------------------ columns for others
    @property
    def log(self) -> "StoreLog":
        """The rows in :class:`~.record_log.RecordLog`'s columns (production order, comparison,
        Parquet export's grouping)."""
        if self._log is None:
            self._log = StoreLog(self)
        return self._log

    def sql_sources(self):
        """What ``Trial.sql`` puts in its views: ``(statistics files, tensors files, rows)``: the
        local Parquet files of the sealed segments read (paths), and as arrow tables
        ``{"statistics": ..., "tensors": ...}`` the rows of every other segment (live ones;
        all of a remote run's), a ``worker`` column added as the Hive folders give it."""
        local = not getattr(self.storage, "remote", False)
        statistics_files, tensors_files, others = [], [], []
        for part in self.loaded_parts():
            if local and part.sealed:
                statistics_files.append(self.storage.local_path(part.source))
                relpath = store.tensors_relpath(part.folder, part.number)
                if relpath not in self._warned:
                    tensors_files.append(self.storage.local_path(relpath))
            else:
                others.append(part)
        return statistics_files, tensors_files, {"statistics": self._arrow_statistics(others),
                                                 "tensors": self._arrow_tensors(others)}

    def _arrow_statistics(self, parts: List[_Part]):
        import pyarrow as pa

        def texts(codes, items):
            return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(items, pa.string()))

        pieces = [p for p in parts if len(p)]
        cat = (lambda name: np.concatenate([getattr(p, name) for p in pieces])) if pieces else \
            (lambda name: np.zeros(0, np.int64))
        mode_names = [m.name if m is not None else "" for m in (_MODE_BY_VALUE.get(v) for v in range(8))]
        return pa.table({
            "step": pa.array(cat("step"), pa.int64()),
            "mode": texts(cat("mode").astype(np.int32), mode_names),
            "mode_step": pa.array(cat("mode_step"), pa.int64()),
            "tensor": texts(cat("tensor").astype(np.int32), self.names.items),
            "reduction": texts(cat("label").astype(np.int32), self.labels.items),
            "value": pa.array(cat("value").astype(np.float64), pa.float64()),
            "dtype": texts(cat("dtype").astype(np.int32), self.dtypes.items),
            "ndim": pa.array(cat("ndim").astype(np.int8), pa.int8()),
            "wall_time": pa.nulls(sum(len(p) for p in pieces), pa.float64()),
            "worker": texts(np.repeat(np.asarray([p.worker_id for p in pieces], np.int32),
                                      [len(p) for p in pieces]), self.workers.items),
        })

    def _arrow_tensors(self, parts: List[_Part]):
        import pyarrow as pa

        rows = [(part.worker,) + row for part in parts for row in part.tensor_rows]
        names = ("worker", "step", "mode", "mode_step", "tensor", "kind", "file", "offset", "length", "crc32c",
                 "dtype", "shape", "placement")
        columns = list(zip(*rows)) if rows else [()] * len(names)
        data = dict(zip(names, columns))
        data["mode"] = [_MODE_BY_VALUE[m].name for m in data["mode"]]
        types = {"step": pa.int64(), "mode_step": pa.int64(), "offset": pa.int64(), "length": pa.int64(),
                 "crc32c": pa.int64(), "shape": pa.list_(pa.int64())}
        return pa.table({name: pa.array(list(data[name]), types.get(name, pa.string())) for name in names})

    def table(self, names, modes, steps, workers, include_incomplete: bool, labels, reader, on_error: str):
        """``Trial.to_table``'s rows, from the columns (store_table.py)."""
        from .store_table import store_table

        return store_table(self, names, modes, steps, workers, include_incomplete, labels, reader, on_error)


def _age_ns(mtime_ns: int) -> int:
    import time

    return time.time_ns() - mtime_ns


def _complete_batches(data: bytes, where: str) -> list:
    """The record batches of an Arrow IPC stream that are complete: a stream cut short (a
    live file being written, or left by a killed writer) ends at its last whole batch. A
    stream whose start is no Arrow IPC stream is a StoreFileError."""
    import pyarrow as pa

    if len(data) < 8 or (data[:4] == b"\xff\xff\xff\xff" and 8 + struct.unpack("<i", data[4:8])[0] > len(data)):
        return []  # not even its schema yet
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StoreFileError(f"not an Arrow IPC stream: {exc}") from None
    batches = []
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError) as exc:
            logger.debug("%s: stream ends in an incomplete batch after %d batches (%s)", where, len(batches), exc)
            break
        batches.append(batch)
    return batches


# ---------------------------------------------------------------------------- mappings
class _Catalog(Mapping):
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
            records = self._built[name] = _LazyRecords(self._index, name)
        return records

    def get(self, name, default=None):
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._index.present_names())

    def __len__(self) -> int:
        return len(self._index.present_names())

    def keys(self):
        return self._index.present_names().keys()

    def update(self, parts: List[_Part]) -> None:
        """Segments were read or grew: the records handed out take their rows."""
        for records in self._built.values():
            records.rebuild()


#: Steps whose entries a :class:`_StepMap` keeps made (they are made again when asked for).
_STEP_CACHE = 4096


class _LazyRecords(TensorRecords):
    """A tensor's :class:`TensorRecords` over the store's columns: ``locations``,
    ``reductions`` and ``step_workers`` are :class:`_StepMap` s that make a step's entries
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
        self.locations = _StepMap(self, "value")
        self.reductions = _StepMap(self, "reduction")
        self.step_workers = _StepMap(self, "workers")
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
                has_rows = any(index.tensor_row_name(r[3])[0] == self.name for r in part.tensor_rows)
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
                for row in part.tensor_rows:
                    base, key = index.tensor_row_name(row[3])
                    if base == self.name:
                        index._add_tensor_row(eager, part.worker, row, key, part)
        self._sources = sources

        def steps_of(pieces, extra):
            found = np.unique(np.concatenate(pieces)) if pieces else np.zeros(0, np.int64)
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
        """What the map of ``kind`` holds at ``step`` (see :class:`_StepMap`)."""
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


class _StepMap(Mapping):
    """``step -> entries`` of one tensor (``value``: ``{worker: location}``; ``reduction``:
    ``{worker: {key: location}}``; ``workers``: the set of workers with anything), made when
    a step is asked for, the last few thousand kept."""

    def __init__(self, records: _LazyRecords, kind: str):
        self._records = records
        self._kind = kind
        self._steps: List[int] = []
        self._known: Set[int] = set()
        self._made: Dict[int, object] = {}

    def reset(self, steps: np.ndarray) -> None:
        self._steps = steps.tolist()
        self._known = set(self._steps)
        self._made = {}

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
        return len(self._steps)

    def __bool__(self) -> bool:
        return bool(self._steps)

    def keys(self):
        return list(self._steps)

    def values(self):
        return (self[s] for s in self._steps)

    def items(self):
        return ((s, self[s]) for s in self._steps)


class _StepNames:
    """``step -> names saved at it``, computed when asked for (``tensors_for_step``)."""

    def __init__(self, index: StoreIndex):
        self._index = index
        self._cache: Dict[int, Set[str]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def get(self, step: int, default=None):
        found = self._cache.get(step)
        if found is None:
            index = self._index
            ids: Set[int] = set()
            names: Set[str] = set()
            for part in index.loaded_parts():
                if part.lo is None or not part.lo <= step <= part.hi:
                    continue
                if len(part):
                    ids.update(index.tensor_ids_at(part, step))
                names.update(index.tensor_row_name(r[3])[0] for r in part.tensor_rows if r[0] == step)
            names.update(index.names.items[i] for i in ids)
            if not names:
                return default
            found = self._cache[step] = names
        return found


class _ModeNames:
    """``mode -> names saved in it``, computed when asked for (``tensors_for_mode``)."""

    def __init__(self, index: StoreIndex):
        self._index = index
        self._cache: Dict[ModeKeys, Set[str]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def get(self, mode: ModeKeys, default=None):
        found = self._cache.get(mode)
        if found is None:
            index = self._index
            ids: Set[int] = set()
            names: Set[str] = set()
            for part in index.loaded_parts():
                if len(part):
                    ids.update(part.present(mode.value).tolist())
                names.update(index.tensor_row_name(r[3])[0] for r in part.tensor_rows if r[1] == mode.value)
            names.update(index.names.items[i] for i in ids)
            if not names:
                return default
            found = self._cache[mode] = names
        return found


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
                rows = part.tensor_rows
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

"""What a run store says (docs/format.md section 10), read incrementally: the reader of the
``store`` layout, in place of the index files' :class:`~.run_index.RunIndex`.

A run store holds, per worker and segment, a ``statistics`` Parquet file (one row per scalar
or reduction value, the value inline), a ``tensors`` Parquet file (where each whole tensor's
record lies in the segment's chunk files) and, while the segment is written, a live Arrow
IPC file holding the same rows batch by batch (storage/format/store.py). A segment whose
statistics file exists is sealed: its Parquet files are read once and never again; a live
segment's file is read again when it has grown, its complete batches only.

What is kept is columns, not per-value objects:

* per segment (:class:`Part`) numpy columns of its statistics rows (``step``, ``mode``,
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
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from ...exceptions import IndexReaderException, MixedRunLayouts, UnsafeRunFile
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag, split_reduction_label
from ...storage.format import store
from ...storage.store_rows import complete_batches
from ...storage.format.index import _parse_placements
from ...storage.format.layout import EVENTS_DIR, INDEX_DIR
from .locations import TensorLocation, TensorRecords
from .paths import worker_from_name
from .record_log import _Interner
from .steps import StepIndex
from .store_columns import (
    MODE_BY_VALUE, STAT_STEP_COLUMNS, STAT_VALUE_COLUMNS, TENSOR_COLUMNS, MAX_DECLARED_UNCOMPRESSED_BYTES,
    MAX_PARQUET_FOOTER_BYTES, MAX_SEGMENT_FILE_ROWS, MAX_STORE_FILE_BYTES, StoreFileError, check_columns,
    int_column, mode_values, number_column, step_triples, text_ids)
from .store_records import Catalog, ModeNames, StepNames, StoreLog
from .store_segments import Part

logger = logging.getLogger("smdebug.trials")

__all__ = ["StoreIndex", "StoreFileError", "MAX_STORE_FILE_BYTES", "MAX_PARQUET_FOOTER_BYTES",
           "MAX_SEGMENT_FILE_ROWS", "MAX_DECLARED_UNCOMPRESSED_BYTES"]


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
        self.tensors = Catalog(self)
        self.tensors_for_step = StepNames(self)
        self.tensors_for_mode = ModeNames(self)
        self.corrupt_index_files: List[str] = []  # store files skipped, relative to the run
        self._parts: Dict[Tuple[str, int], Part] = {}
        self._sealed_seen: Set[str] = set()  # statistics files read (or skipped for good)
        self._warned: Set[str] = set()
        self._dir_mtime: Dict[str, int] = {}
        self._names_cache: Optional[Dict[str, None]] = None
        self._tensor_row_names: Dict[str, Tuple[str, Optional[Tuple[str, bool]]]] = {}
        self._rows_by_tensor: Dict[int, Tuple[list, Dict[str, list]]] = {}  # id(part) -> (its rows, by name)
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
        changed: List[Part] = []
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

    def _part(self, folder: str, number: int) -> Part:
        part = self._parts.get((folder, number))
        if part is None:
            worker = worker_from_name(folder)
            part = self._parts[(folder, number)] = Part(folder, worker, self.workers.id(worker), number)
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
                check_columns(pf.schema_arrow, columns, "its schema")
            except StoreFileError:
                raise
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise StoreFileError(f"not a readable Parquet file: {exc}") from None
        except BaseException:
            if handle is not None:
                handle.close()
            raise
        return pf, handle

    def _read_columns(self, relpath: str, columns, schema, rows: Optional[int] = None, in_range: bool = False):
        """``columns`` of a sealed file whose schema must have ``schema``'s columns (``rows``:
        the rows it must hold) as an arrow table; ``in_range``: None when the file's step
        statistics say it holds no step of ``range_steps``."""
        pf, handle = self._parquet(relpath, schema)
        try:
            if rows is not None and pf.metadata.num_rows != rows:
                raise StoreFileError(f"it now holds {pf.metadata.num_rows} rows, not the {rows} read before "
                                     "(replaced while the trial was open)")
            if in_range and self.range_steps is not None and not self._may_hold_range(pf.metadata):
                return None
            return pf.read(columns=list(columns))
        finally:
            if handle is not None:
                handle.close()

    def _may_hold_range(self, meta) -> bool:
        """Whether a Parquet file's row groups may hold a step of ``range_steps`` (their min/max
        statistics of ``step``; True where a row group has none)."""
        column = meta.schema.to_arrow_schema().get_field_index("step")
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(column).statistics if column >= 0 else None
            if stats is None or not stats.has_min_max or self._in_range(stats.min, stats.max):
                return True
        return False

    def _read_sealed(self, worker: str, number: int, relpath: str) -> Optional[Part]:
        """A sealed segment's Parquet files (statistics: steps now, values when first needed)."""
        import pyarrow as pa

        tensors_relpath = store.tensors_relpath(worker, number)
        where = relpath
        try:
            table = self._read_columns(relpath, STAT_STEP_COLUMNS, STAT_STEP_COLUMNS + STAT_VALUE_COLUMNS,
                                       in_range=True)
            if table is None:
                return None  # no step of range_steps (its step statistics say so)
            rows = table.num_rows
            step = int_column(table.column("step"), where)
            mode = mode_values(table.column("mode"), where)
            mode_step = int_column(table.column("mode_step"), where)
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
                columns = (text_ids(t.column("tensor"), self.names, where),
                           text_ids(t.column("reduction"), self.labels, where),
                           number_column(t.column("value"), np.float64), None, None)
            except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
                self._warn(where, str(exc), "its values are left out of the trial")
                return None
            self._label_keys_update()
            return columns if keep is None else tuple(c if c is None else c[keep] for c in columns)

        def read_rest(where=where, rows=rows):
            """The value columns' table (or the exception that stopped it): safe in a thread."""
            try:
                return self._read_columns(where, STAT_VALUE_COLUMNS[:3], STAT_STEP_COLUMNS + STAT_VALUE_COLUMNS, rows)
            except (StoreFileError, pa.ArrowException, OSError, ValueError) as exc:
                return exc

        def read_types(where=where, rows=rows, keep=keep):
            """The dtype and ndim columns (None if the file fails now: warned)."""
            try:
                t = self._read_columns(where, ("dtype", "ndim"), STAT_STEP_COLUMNS + STAT_VALUE_COLUMNS, rows)
                columns = (text_ids(t.column("dtype"), self.dtypes, where), int_column(t.column("ndim"), where, np.int8))
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
        return self._tensor_rows(self._read_columns(relpath, TENSOR_COLUMNS, TENSOR_COLUMNS), relpath)

    def _tensor_rows(self, table, where: str) -> list:
        """A tensors table as row tuples (see :meth:`Part.set_rows`)."""
        if not table.num_rows:
            return []
        step = int_column(table.column("step"), where).tolist()
        mode = mode_values(table.column("mode"), where).tolist()
        mode_step = int_column(table.column("mode_step"), where).tolist()
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

    def _read_live(self, worker: str, number: int, relpath: str, part: Optional[Part]) -> Optional[Part]:
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
            batches = complete_batches(data, relpath)
            if not batches:
                if part is None:
                    part = self._part(worker, number)
                part.live_size = len(data)
                return None
            table = pa.Table.from_batches(batches)
            check_columns(table.schema, ("table",) + STAT_STEP_COLUMNS + STAT_VALUE_COLUMNS + TENSOR_COLUMNS,
                           relpath)
            which = int_column(table.column("table"), relpath, np.int8)
            stats = table.filter(pa.array(which == store.LIVE_STATISTICS))
            tensors = table.filter(pa.array(which == store.LIVE_TENSORS))
            step = int_column(stats.column("step"), relpath)
            mode = mode_values(stats.column("mode"), relpath)
            mode_step = int_column(stats.column("mode_step"), relpath)
            rest = (text_ids(stats.column("tensor"), self.names, relpath),
                    text_ids(stats.column("reduction"), self.labels, relpath),
                    number_column(stats.column("value"), np.float64),
                    text_ids(stats.column("dtype"), self.dtypes, relpath),
                    int_column(stats.column("ndim"), relpath, np.int8))
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
            self._label_keys.append(split_reduction_label(label))

    # ------------------------------------------------------------------ registering
    def _changed(self, parts: List[Part]) -> None:
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
            steps, modes, mode_steps = step_triples(s, m, ms)
            worker = part.worker
            for step, mode, mode_step in zip(steps.tolist(), modes.tolist(), mode_steps.tolist()):
                if add(step, worker, MODE_BY_VALUE[mode], mode_step, root):
                    new_steps = True
        if new_steps:
            self.steps.forget_sorted()
        self._names_cache = None
        self._log = None
        self.tensors_for_step.clear()
        self.tensors_for_mode.clear()
        self._rows_by_tensor.clear()
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

    def tensor_ids_at(self, part: Part, step: int) -> List[int]:
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

    def ordered_parts(self) -> List[Part]:
        """Every segment read, worker by worker, in segment order (later rows win)."""
        return [self._parts[k] for k in sorted(self._parts)]

    def loaded_parts(self) -> List[Part]:
        """:meth:`ordered_parts` with every column read (a segment whose values fail is emptied)."""
        parts = self.ordered_parts()
        pending = [p for p in parts if not p.loaded]
        threads = min(len(pending), os.cpu_count() or 1, 8) if pending else 0
        if threads > 1:
            # Decoding a column releases the GIL: the files are read side by side; their
            # texts are then interned here, in order.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                read = list(pool.map(Part.read_rest, pending))
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

    def tensor_rows_of(self, part: Part, name: str) -> list:
        """A segment's tensors-table rows of tensor ``name``, in order (grouped once per segment:
        each tensor's records ask, and a segment can hold thousands of whole tensors)."""
        known = self._rows_by_tensor.get(id(part))
        if known is None or known[0] is not part.tensor_rows:
            by_name: Dict[str, list] = {}
            for row in part.tensor_rows:
                by_name.setdefault(self.tensor_row_name(row[3])[0], []).append(row)
            known = self._rows_by_tensor[id(part)] = (part.tensor_rows, by_name)
        return known[1].get(name, [])

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

    def shape_steps(self) -> Dict[str, np.ndarray]:
        """``name -> global steps`` of the saved shapes (the tensors table's shape rows)."""
        found: Dict[str, Set[int]] = {}
        for part in self.loaded_parts():
            for r in part.tensor_rows:
                if r[4] == store.KIND_SHAPE:
                    found.setdefault(self.tensor_row_name(r[3])[0], set()).add(r[0])
        return {n: np.asarray(sorted(s), np.int64) for n, s in found.items()}

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
    def _add_tensor_row(self, records: TensorRecords, worker: str, row, key, part: Part) -> None:
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

    def table(self, names, modes, steps, workers, include_incomplete: bool, labels, reader, on_error: str,
              progress: Optional[bool] = None):
        """``Trial.to_table``'s rows, from the columns (store_table.py)."""
        from .store_table import store_table

        return store_table(self, names, modes, steps, workers, include_incomplete, labels, reader, on_error)


def _age_ns(mtime_ns: int) -> int:
    import time

    return time.time_ns() - mtime_ns


def pick_index(storage, path: str, index, steps: StepIndex, stats: Dict[str, int]):
    """``(index, layout)`` of a run once it has written one layout: a :class:`StoreIndex` for
    ``store/`` (sharing ``steps`` and ``stats``), ``index`` (the index files' reader) for
    ``index/`` or ``events/``, ``(index, None)`` while it has neither. MixedRunLayouts for both."""
    has_store = storage.is_dir(store.STORE_DIR)
    has_index = storage.is_dir(INDEX_DIR) or storage.is_dir(EVENTS_DIR)
    if has_store and has_index:
        raise MixedRunLayouts(
            f"{path} mixes two layouts: it has {store.STORE_DIR}/ (the run store) and {INDEX_DIR}/ or {EVENTS_DIR}/ "
            "(smdebug 1.0.34's files), as when two jobs of different layouts wrote into one directory. A trial "
            "reads one layout: move one of them into a directory of its own (with a copy of collections/), or "
            "write each job to its own out_dir")
    if has_store:
        return StoreIndex(storage, index.range_steps, stats, steps), store.STORE_LAYOUT
    return index, (store.LAYOUT_1034 if has_index else None)

"""Steps into the run store (docs/format.md section 10): numbers as rows, whole tensors as
records in chunk files, segment by segment. Used by the writer thread only.

What happens to a submitted step:

* each scalar and reduction becomes a row (tensor, reduction, value, dtype, rank) of the
  step's open rows; a batch of reductions (a :class:`ScalarRun`) becomes columns at once,
  from codes cached per list of tags, so a number costs a few nanoseconds, not a record;
* each whole tensor is appended to the segment's chunk file as a record (the bytes of
  ``format/codec.py``, one decoder for both layouts) and becomes a row of where it lies;
* when the step is published (the worker's next step arrives, or :meth:`publish`), its
  rows join the segment's unflushed rows; :meth:`sync` (the writer calls it whenever its
  queue runs dry, so within its ``max_delay``) appends them to the segment's live file as
  one Arrow record batch of whole steps, after flushing the chunk they point into;
* a segment rolls after ``segment_steps`` steps or ``segment_seconds`` seconds (or when it
  holds too many rows): its chunks are closed and published, then its ``tensors`` and
  ``statistics`` Parquet files (the statistics file seals it), then its live file goes.

A SIGKILL at any instant therefore leaves every synced step readable, from Parquet or
from the live file's complete batches, and never half a step.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Dict, List, Optional

import numpy as np

from ..format import store
from ..format.codec import StepEncoder
from ..format.records import RECORD_OVERHEAD, append_record
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag, reduction_label
from ..step_data import ScalarRun
from ..store_rows import seal_left_live_segments
from .step_sink import encode_or_warn

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_STEPS = 1000
DEFAULT_SEGMENT_SECONDS = 300.0
#: A segment also rolls when it holds this many rows (memory: its batches are kept until it seals).
MAX_SEGMENT_ROWS = 2_000_000
#: A chunk file rolls (within its segment, at a step boundary) past this many bytes.
DEFAULT_CHUNK_BYTES = 256 << 20
_CHUNK_BUFFER_BYTES = 1 << 20
_MAX_CACHED_RUNS = 16


class _Texts:
    """Strings numbered in order of first sight: the dictionary of a column."""

    def __init__(self):
        self.codes: Dict[str, int] = {}
        self.items: List[str] = []

    def code(self, text: str) -> int:
        found = self.codes.get(text)
        if found is None:
            found = self.codes[text] = len(self.items)
            self.items.append(text)
        return found

    def arrow(self):
        """The strings as an arrow array, made again only when new ones came."""
        cached = self.__dict__.get("_arrow")
        if cached is None or len(cached) != len(self.items):
            import pyarrow as pa

            cached = self._arrow = pa.array(self.items, pa.string())
        return cached


def _split_tag(tag: str):
    """``(tensor, reduction label)`` of a record name kept as a row, or None for a reduction
    tag that would not be rebuilt from them exactly (it stays a whole record)."""
    if REDUCTION_TAG_PREFIX not in tag:
        return tag, store.OWN_VALUE
    parsed = parse_reduction_tag(tag)
    if parsed is None:
        return None
    op, is_abs, tensor = parsed
    label = reduction_label(op, is_abs)
    if tag != f"{REDUCTION_TAG_PREFIX}{label}/{tensor}":
        return None
    return tensor, label


class _Rows:
    """Rows in columns, appended piece by piece (numpy arrays), joined once."""

    def __init__(self):
        self.stat_pieces: List[tuple] = []  # (step, mode, mode_step, wall, tensor, reduction, value, dtype, ndim)
        self.tensor_rows: List[tuple] = []  # (step, mode, mode_step, wall, tensor, kind, file, offset, length, crc,
        #                                      dtype, shape, original_name, placement)
        self.count = 0

    def __len__(self):
        return self.count


class _OpenStep:
    def __init__(self, global_step, mode, mode_step, wall_time):
        self.global_step = global_step
        self.mode = mode
        self.mode_step = mode_step
        self.wall_time = wall_time
        self.stat_pieces: List[tuple] = []  # (tensor codes, reduction codes, values, dtype codes, ndims)
        self.tensor_rows: List[tuple] = []
        self.placements: Dict[str, dict] = {}
        self.warned_mode_mismatch = False


class _Segment:
    """One worker's segment being written."""

    def __init__(self, number: int):
        self.number = number
        self.started = time.monotonic()
        self.steps = 0
        self.rows = 0
        self.batches: list = []  # synced record batches, kept for sealing
        self.live = None  # (file, ipc writer)
        self.live_relpath: Optional[str] = None
        self.chunk = None  # open chunk file
        self.chunk_number = 0
        self.chunk_relpath: Optional[str] = None
        self.chunk_offset = 0
        self.chunks: List[tuple] = []  # (relpath, nbytes) closed
        self.unsynced = _Rows()


class _Worker:
    def __init__(self, name: str, first_segment: int):
        self.name = name
        self.next_segment = first_segment
        self.segment: Optional[_Segment] = None
        self.open_step: Optional[_OpenStep] = None


class StoreSink:
    """Writes submitted steps into ``store/`` through ``publisher`` (:class:`~.publish.Publisher`)."""

    def __init__(self, publisher, segment_steps: int = DEFAULT_SEGMENT_STEPS,
                 segment_seconds: float = DEFAULT_SEGMENT_SECONDS, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        import pyarrow  # noqa: F401  (fail here, at the writer's start, if it is missing)

        self._files = publisher
        self.segment_steps = int(segment_steps)
        self.segment_seconds = float(segment_seconds)
        self.chunk_bytes = int(chunk_bytes)
        self._workers: Dict[str, _Worker] = {}
        self._tensors = _Texts()
        self._reductions = _Texts()
        self._dtypes = _Texts()
        self._modes = _Texts()
        self._texts = _Texts()  # the kind and file columns of tensor rows
        self._runs: Dict[int, tuple] = {}  # id(tags) -> (tags, tensor codes, reduction codes) or None
        self._pair_codes: Dict[str, Optional[tuple]] = {}
        self._warned_encode: set = set()
        self._wrote_layout = False

    # ------------------------------------------------------------------ steps

    def write_step(self, step) -> None:
        worker = self._worker(step.worker)
        open_step = worker.open_step
        if open_step is not None and open_step.global_step != step.global_step:
            self._publish(worker)
            open_step = None
        if open_step is None:
            if not (step.tensors or step.shapes):
                return
            if self._files.spool_full():
                return  # the uploader warned once; training must not wait for the network
            open_step = worker.open_step = _OpenStep(step.global_step, step.mode, step.mode_step, step.wall_time)
        elif (step.mode, step.mode_step) != (open_step.mode, open_step.mode_step) \
                and not open_step.warned_mode_mismatch:
            open_step.warned_mode_mismatch = True
            logger.warning(
                "step %d of %s was opened as %s step %d; data submitted as %s step %d is filed under the former",
                step.global_step, step.worker, open_step.mode.name, open_step.mode_step, step.mode.name,
                step.mode_step)
        pairs = []
        for item in step.tensors:
            if type(item) is ScalarRun:
                if not self._add_run(open_step, item):
                    pairs.extend(item.pairs())
            else:
                pairs.append(item)
        if pairs:
            whole = self._add_pairs(open_step, pairs, step.placements)
            if whole:
                encoder = StepEncoder(global_step=open_step.global_step, mode=open_step.mode,
                                      mode_step=open_step.mode_step, wall_time=open_step.wall_time)
                self._write_records(worker, open_step, encoder, whole)
        if step.placements:
            open_step.placements.update(step.placements)
        for shape_item in step.shapes:
            name, *original, shape = shape_item
            open_step.tensor_rows.append((name, store.KIND_SHAPE, None, None, None, None, None,
                                          [int(s) for s in shape],
                                          original[0] if original and original[0] != name else None))

    def _add_run(self, open_step, run) -> bool:
        """A batch of reductions as columns; False when some tag cannot be a row."""
        cached = self._runs.get(id(run.tags))
        if cached is None or cached[0] is not run.tags:
            split = [_split_tag(tag) for tag in run.tags]
            if any(s is None for s in split):
                codes = None
            else:
                codes = (np.fromiter((self._tensors.code(t) for t, _ in split), np.int32, len(split)),
                         np.fromiter((self._reductions.code(r) for _, r in split), np.int32, len(split)))
            if len(self._runs) >= _MAX_CACHED_RUNS:
                self._runs.clear()
            cached = self._runs[id(run.tags)] = (run.tags, codes)
        codes = cached[1]
        if codes is None:
            return False
        n = len(run)
        open_step.stat_pieces.append((codes[0], codes[1], run.values,
                                      np.full(n, self._dtypes.code("float64"), np.int32), np.zeros(n, np.int8)))
        return True

    def _add_pairs(self, open_step, pairs, placements) -> list:
        """Scalars as rows; returns the pairs that stay whole records (and every piece of a
        sharded tensor, whose row carries its placement, docs/format.md 10.3)."""
        tensor_codes, reduction_codes, values, dtypes, ndims = [], [], [], [], []
        whole = []
        for tag, value in pairs:
            codes = self._pair_codes.get(tag, False)
            if codes is False:
                split = _split_tag(tag) if isinstance(tag, str) else None
                codes = None if split is None else (self._tensors.code(split[0]), self._reductions.code(split[1]))
                if len(self._pair_codes) > 1 << 16:
                    self._pair_codes.clear()
                self._pair_codes[tag] = codes
            dtype = store.statistic_dtype(value) if codes is not None and tag not in placements else None
            if dtype is None:
                whole.append((tag, value))
                continue
            tensor_codes.append(codes[0])
            reduction_codes.append(codes[1])
            values.append(float(value.item() if hasattr(value, "item") else value))
            dtypes.append(self._dtypes.code(dtype.name))
            ndims.append(int(np.ndim(value)))
        if values:
            open_step.stat_pieces.append((np.asarray(tensor_codes, np.int32), np.asarray(reduction_codes, np.int32),
                                          np.asarray(values, np.float64), np.asarray(dtypes, np.int32),
                                          np.asarray(ndims, np.int8)))
        return whole

    def _write_records(self, worker, open_step, encoder, pairs) -> None:
        segment = self._segment(worker)
        for tag, value in pairs:
            parts = encode_or_warn(encoder, tag, value, self._warned_encode)
            if parts is None:
                continue
            handle = self._chunk(worker, segment)
            length, crc = append_record(handle.write, parts)
            arr = np.asarray(value)
            open_step.tensor_rows.append((tag, store.KIND_VALUE, segment.chunk_relpath, segment.chunk_offset,
                                          length + RECORD_OVERHEAD, crc, arr.dtype.name,
                                          [int(s) for s in arr.shape], None))
            segment.chunk_offset += length + RECORD_OVERHEAD

    # ------------------------------------------------------------------ publishing

    def publish(self, worker: str) -> None:
        w = self._workers.get(worker)
        if w is not None and w.open_step is not None:
            self._publish(w)

    def publish_all(self) -> None:
        for w in self._workers.values():
            if w.open_step is not None:
                self._publish(w)

    def sync(self) -> None:
        """Append every published step not yet in a live file (the writer's queue ran dry)."""
        for w in self._workers.values():
            if w.segment is not None and len(w.segment.unsynced):
                self._sync(w)

    def seal_all(self) -> None:
        """Publish and seal every open segment (a remote run's flush: sealed is what goes up)."""
        self.publish_all()
        for w in self._workers.values():
            if w.segment is not None:
                self._seal(w)

    def close(self) -> None:
        """Seal everything at the end of the run."""
        self.seal_all()
        for folder in [store.live_relpath(w, 0).rpartition("/")[0] for w in self._workers] + [store.LIVE_DIR]:
            try:  # no live segment left: no empty folders either (another worker's may still be there)
                os.rmdir(self._files.path(folder))
            except OSError:
                pass

    def abandon(self) -> None:
        """Close open files without sealing (the writer failed): what was synced stays readable."""
        for w in self._workers.values():
            s = w.segment
            if s is None:
                continue
            for handle in (s.chunk, s.live[0] if s.live else None):
                if handle is not None:
                    try:
                        handle.close()
                    except OSError:
                        pass
            w.segment = None

    def _publish(self, worker: _Worker) -> None:
        open_step, worker.open_step = worker.open_step, None
        if open_step.placements:
            names = {row[0] for row in open_step.tensor_rows}
            placements = {n: json.dumps(p, sort_keys=True) for n, p in open_step.placements.items() if n in names}
        else:
            placements = {}
        if not open_step.stat_pieces and not open_step.tensor_rows:
            return
        segment = self._segment(worker)
        mode = self._modes.code(open_step.mode.name)
        rows = segment.unsynced
        head = (open_step.global_step, mode, open_step.mode_step, open_step.wall_time)
        for piece in open_step.stat_pieces:
            rows.stat_pieces.append(head + piece)
            rows.count += len(piece[0])
        if open_step.tensor_rows:
            written = {row[0] for row in open_step.tensor_rows if row[1] == store.KIND_VALUE}
            for row in open_step.tensor_rows:
                if row[1] == store.KIND_SHAPE and row[0] in written:
                    continue  # the record itself is there (docs/format.md 3.2)
                rows.tensor_rows.append(head + row + (placements.get(row[0]),))
                rows.count += 1
        segment.steps += 1
        if self._should_roll(segment):
            self._seal(worker)
        elif segment.chunk is not None and segment.chunk_offset >= self.chunk_bytes:
            self._roll_chunk(segment)

    def _should_roll(self, segment: _Segment) -> bool:
        return (segment.steps >= self.segment_steps or segment.rows + len(segment.unsynced) >= MAX_SEGMENT_ROWS
                or time.monotonic() - segment.started >= self.segment_seconds)

    # ------------------------------------------------------------------ files

    def _worker(self, name: str) -> _Worker:
        w = self._workers.get(name)
        if w is None:
            if not self._wrote_layout:
                self._wrote_layout = True
                if not self._files.exists(store.LAYOUT_FILE):  # the same bytes from every worker: the first wins
                    self._files.write_atomically(store.LAYOUT_FILE, json.dumps(
                        {"layout": store.STORE_LAYOUT, "version": store.STORE_VERSION}).encode(), private_tmp=True)
            if self._files.uploader is None:  # a killed earlier process of this worker: its live segments sealed
                seal_left_live_segments(self._files.out_dir, name)
            w = self._workers[name] = _Worker(name, self._first_free_segment(name))
        return w

    def _first_free_segment(self, worker: str) -> int:
        """After the segments a previous process of this worker left (a job started again)."""
        used = [-1]
        for directory, parse in ((store.STATISTICS_DIR, store.segment_of_part), (store.LIVE_DIR, store.segment_of_live),
                                 (store.TENSORS_DIR, store.segment_of_part)):
            try:
                names = os.listdir(self._files.path(f"{directory}/{store.worker_dir(worker)}"))
            except OSError:
                continue
            used += [n for n in map(parse, names) if n is not None]
        try:
            chunk_names = os.listdir(self._files.path(f"{store.CHUNKS_DIR}/{store.worker_dir(worker)}"))
        except OSError:
            chunk_names = []
        used += [int(n[:store.SEGMENT_DIGITS]) for n in chunk_names if n[:store.SEGMENT_DIGITS].isdigit()]
        return max(used) + 1

    def _segment(self, worker: _Worker) -> _Segment:
        if worker.segment is None:
            if worker.next_segment > store.MAX_SEGMENT:
                raise OSError(f"worker {worker.name} has used all {store.MAX_SEGMENT} segment numbers")
            worker.segment = _Segment(worker.next_segment)
            worker.next_segment += 1
        return worker.segment

    def _chunk(self, worker: _Worker, segment: _Segment):
        if segment.chunk is None:
            segment.chunk_relpath = store.chunk_relpath(worker.name, segment.number, segment.chunk_number)
            # Written under its final name: rows point into it while it grows (the live file
            # names only bytes flushed before it); it is complete when its segment seals.
            segment.chunk = self._files.open_new(segment.chunk_relpath, buffering=_CHUNK_BUFFER_BYTES)
            segment.chunk_offset = 0
        return segment.chunk

    def _roll_chunk(self, segment: _Segment) -> None:
        segment.chunk.close()
        segment.chunks.append((segment.chunk_relpath, segment.chunk_offset))
        segment.chunk = None
        segment.chunk_number += 1

    def _dictionary(self, codes, texts: _Texts, mask=None):
        import pyarrow as pa

        # Codes come from ``texts`` itself: no need to check them again.
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask), texts.arrow(), safe=False)

    def _statistics_batch(self, pieces: List[tuple]):
        """Statistics rows as a batch of the live schema (the tensor columns null)."""
        import pyarrow as pa

        counts = [len(p[4]) for p in pieces]
        head = list(zip(*(p[:4] for p in pieces)))
        columns = {
            "table": pa.array(np.full(sum(counts), store.LIVE_STATISTICS, np.int8)),
            "step": pa.array(np.repeat(np.array(head[0], np.int64), counts)),
            "mode": self._dictionary(np.repeat(np.array(head[1], np.int32), counts), self._modes),
            "mode_step": pa.array(np.repeat(np.array(head[2], np.int64), counts)),
            "wall_time": pa.array(np.repeat(np.array(head[3], np.float64), counts)),
            "tensor": self._dictionary(np.concatenate([p[4] for p in pieces]), self._tensors),
            "reduction": self._dictionary(np.concatenate([p[5] for p in pieces]), self._reductions),
            "value": pa.array(np.concatenate([p[6] for p in pieces])),
            "dtype": self._dictionary(np.concatenate([p[7] for p in pieces]), self._dtypes),
            "ndim": pa.array(np.concatenate([p[8] for p in pieces])),
        }
        return self._live_batch(columns, sum(counts))

    def _tensors_batch(self, rows: List[tuple]):
        """Tensor rows as a batch of the live schema (the statistics columns null)."""
        import pyarrow as pa

        (step, mode, mode_step, wall, tensor, kind, file, offset, length, crc, dtype, shape, original,
         placement) = zip(*rows)
        n = len(rows)
        no_file = np.array([f is None for f in file])
        columns = {
            "table": pa.array(np.full(n, store.LIVE_TENSORS, np.int8)),
            "step": pa.array(step, pa.int64()),
            "mode": self._dictionary(mode, self._modes),
            "mode_step": pa.array(mode_step, pa.int64()),
            "wall_time": pa.array(wall, pa.float64()),
            "tensor": self._dictionary([self._tensors.code(t) for t in tensor], self._tensors),
            "kind": self._dictionary([self._texts.code(k) for k in kind], self._texts),
            "file": self._dictionary([0 if f is None else self._texts.code(f) for f in file], self._texts,
                                     no_file),
            "offset": pa.array(offset, pa.int64()),
            "length": pa.array(length, pa.int64()),
            "crc32c": pa.array(crc, pa.int64()),
            "dtype": self._dictionary([0 if d is None else self._dtypes.code(d) for d in dtype], self._dtypes,
                                      np.array([d is None for d in dtype])),
            "shape": pa.array(shape, pa.list_(pa.int64())),
            "original_name": pa.array(original, pa.string()),
            "placement": pa.array(placement, pa.string()),
        }
        return self._live_batch(columns, n)

    @staticmethod
    def _live_batch(columns: Dict[str, object], n: int):
        import pyarrow as pa

        live_schema = store.schemas()[2]
        arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in live_schema]
        return pa.RecordBatch.from_arrays(arrays, schema=live_schema)

    def _batch(self, rows: _Rows):
        """One record batch of the live schema holding ``rows`` (whole steps)."""
        import pyarrow as pa

        batches = []
        if rows.stat_pieces:
            batches.append(self._statistics_batch(rows.stat_pieces))
        if rows.tensor_rows:
            batches.append(self._tensors_batch(rows.tensor_rows))
        if len(batches) == 1:
            return batches[0]
        # Each dictionary is a whole code list as it stood (or empty, for a column the batch
        # leaves null): the longer one holds the other, so both batches can take it.
        def longest(i):
            a, b = batches[0].column(i), batches[1].column(i)
            return (a if len(a.dictionary) >= len(b.dictionary) else b).dictionary

        def retyped(batch):
            return pa.RecordBatch.from_arrays(
                [pa.DictionaryArray.from_arrays(col.indices, longest(i)) if isinstance(col, pa.DictionaryArray) else col
                 for i, col in enumerate(batch.columns)], schema=batch.schema)

        first, second = retyped(batches[0]), retyped(batches[1])
        return pa.Table.from_batches([first, second]).combine_chunks().to_batches()[0]

    def _sync(self, worker: _Worker) -> None:
        import pyarrow as pa

        segment = worker.segment
        batch = self._batch(segment.unsynced)
        segment.unsynced = _Rows()
        if segment.chunk is not None:
            segment.chunk.flush()  # the bytes the batch points into, before the batch
        if segment.live is None:
            segment.live_relpath = store.live_relpath(worker.name, segment.number)
            handle = self._files.open_new(segment.live_relpath)
            segment.live = (handle, pa.ipc.new_stream(handle, batch.schema))
        handle, ipc = segment.live
        ipc.write_batch(batch)
        handle.flush()
        segment.batches.append(batch)
        segment.rows += batch.num_rows

    def _seal(self, worker: _Worker) -> None:
        """Chunks, then the tensors file, then the statistics file (the seal), then the live file goes."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        segment = worker.segment
        if len(segment.unsynced):
            self._sync(worker)
        worker.segment = None
        if segment.chunk is not None:
            self._roll_chunk(segment)
        for relpath, nbytes in segment.chunks:
            self._files.announce(relpath, nbytes)
        statistics_schema, tensors_schema, live_schema = store.schemas()
        table = pa.Table.from_batches(segment.batches, schema=live_schema) if segment.batches \
            else live_schema.empty_table()
        kinds = pc.unique(table["table"]).to_pylist() if table.num_rows else []
        for which, schema, relpath in ((store.LIVE_TENSORS, tensors_schema,
                                        store.tensors_relpath(worker.name, segment.number)),
                                       (store.LIVE_STATISTICS, statistics_schema,
                                        store.statistics_relpath(worker.name, segment.number))):
            if which not in kinds:
                part = schema.empty_table()
            else:
                part = table if kinds == [which] else table.filter(pc.equal(table["table"], which))
                part = part.select(schema.names).unify_dictionaries()
            self._files.write_with(relpath, lambda path, part=part: pq.write_table(
                part.cast(schema), path, **store.PARQUET_OPTIONS))
        if segment.live is not None:
            handle, ipc = segment.live
            ipc.close()
            handle.close()
            os.remove(self._files.path(segment.live_relpath))

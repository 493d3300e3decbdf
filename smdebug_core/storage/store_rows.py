"""Reading a run store's rows (docs/format.md 10): one worker's segments, sealed or live, as
two pyarrow tables. The rules of what a reader takes live here once (10.4): a sealed
segment's Parquet files, else the complete batches of its live file.

Files are read through ``read_file(relpath) -> bytes`` and listed through
``list_names(relpath) -> [name]``, so a local directory and an object store read alike.
A file that cannot be read costs its segment, with one warning naming it.
"""
from __future__ import annotations

import io
import logging
import os
import struct
from typing import Callable, Dict, List, Optional, Tuple

from .format import store

logger = logging.getLogger("smdebug.trials")

#: The most bytes read of one Parquet or live file (docs/reader_safety.md): far beyond a
#: segment's 2 million rows, and a bound on what a malicious file can make a reader allocate.
MAX_STORE_FILE_BYTES = 1 << 30


def complete_batches(data: bytes, where: str = "live file") -> list:
    """The record batches of an Arrow IPC stream that are complete: a stream cut short (a live
    file being written, or left by a killed writer) ends at its last whole batch. ValueError
    for bytes whose start is no Arrow IPC stream."""
    import pyarrow as pa

    if len(data) < 8 or (data[:4] == b"\xff\xff\xff\xff" and 8 + struct.unpack("<i", data[4:8])[0] > len(data)):
        return []  # not even its schema yet
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"not an Arrow IPC stream: {exc}") from None
    batches = []
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError) as exc:
            logger.debug("%s: stream ends in an incomplete batch after %d batches (%s)", where, len(batches), exc)
            break
    return batches


def read_live(data: bytes, source: str = "live file"):
    """A live file's complete batches as a table of the live schema (empty, with a warning,
    for a file that is no live file)."""
    import pyarrow as pa

    live_schema = store.schemas()[2]
    try:
        batches = complete_batches(data, source)
        return pa.Table.from_batches(batches).cast(live_schema) if batches else live_schema.empty_table()
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
        logger.warning("smdebug: %s is not a run store live file (%s); its rows are left out", source, exc)
        return live_schema.empty_table()


def split_live(table) -> Tuple[object, object]:
    """``(statistics, tensors)`` rows of a live table."""
    import pyarrow.compute as pc

    statistics_schema, tensors_schema, _ = store.schemas()
    return tuple(table.filter(pc.equal(table["table"], which)).select(schema.names)
                 for which, schema in ((store.LIVE_STATISTICS, statistics_schema),
                                       (store.LIVE_TENSORS, tensors_schema)))


def read_parquet(data: bytes, schema, source: str):
    """A sealed Parquet file's rows, cast to ``schema``; None (with a warning) when it is damaged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(io.BytesIO(data)).select(schema.names).cast(schema)
    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
        logger.warning("smdebug: run store file %s cannot be read (%s); its segment is left out", source, exc)
        return None


class WorkerSegments:
    """The segments of one worker: which are sealed, which live (``segments()``), and their rows."""

    def __init__(self, worker: str, list_names: Callable[[str], List[str]], read_file: Callable[[str], bytes]):
        self.worker = worker
        self._list = list_names
        self._read = read_file

    def segments(self) -> Tuple[List[int], List[int]]:
        """``(sealed, live)`` segment numbers, sorted; a live file beside a seal is not live."""
        part = store.worker_dir(self.worker)
        sealed = sorted(n for n in map(store.segment_of_part, self._list(f"{store.STATISTICS_DIR}/{part}"))
                        if n is not None)
        done = set(sealed)
        live = sorted(n for n in map(store.segment_of_live, self._list(f"{store.LIVE_DIR}/{part}"))
                      if n is not None and n not in done)
        return sealed, live

    def sealed_rows(self, segment: int) -> Optional[Tuple[object, object]]:
        statistics_schema, tensors_schema, _ = store.schemas()
        out = []
        for relpath, schema in ((store.statistics_relpath(self.worker, segment), statistics_schema),
                                (store.tensors_relpath(self.worker, segment), tensors_schema)):
            try:
                data = self._read(relpath)
            except FileNotFoundError:
                if schema is tensors_schema:  # written before the seal, so it must be there
                    logger.warning("smdebug: run store file %s is missing; its segment's whole tensors are "
                                   "left out", relpath)
                    out.append(schema.empty_table())
                    continue
                return None
            table = read_parquet(data, schema, relpath)
            if table is None:
                return None
            out.append(table)
        return out[0], out[1]

    def live_rows(self, segment: int) -> Tuple[object, object]:
        relpath = store.live_relpath(self.worker, segment)
        try:
            data = self._read(relpath)
        except FileNotFoundError:  # sealed meanwhile
            sealed = self.sealed_rows(segment)
            if sealed is not None:
                return sealed
            statistics_schema, tensors_schema, _ = store.schemas()
            return statistics_schema.empty_table(), tensors_schema.empty_table()
        return split_live(read_live(data, relpath))

    def all_rows(self) -> Tuple[object, object]:
        """Every readable row of the worker, in segment order."""
        import pyarrow as pa

        statistics_schema, tensors_schema, _ = store.schemas()
        stats, tensors = [], []
        sealed, live = self.segments()
        for segment in sorted(sealed + live):
            rows = self.sealed_rows(segment) if segment in sealed else self.live_rows(segment)
            if rows is None:
                continue
            stats.append(rows[0])
            tensors.append(rows[1])
        return (pa.concat_tables(stats).unify_dictionaries() if stats else statistics_schema.empty_table(),
                pa.concat_tables(tensors).unify_dictionaries() if tensors else tensors_schema.empty_table())


def local_workers(run_dir: str) -> List[str]:
    """The workers with a partition folder in a local run store."""
    workers = set()
    for directory in (store.STATISTICS_DIR, store.LIVE_DIR, store.TENSORS_DIR):
        try:
            names = os.listdir(os.path.join(run_dir, directory))
        except OSError:
            continue
        workers.update(w for w in map(store.worker_of_dir, names) if w is not None)
    return sorted(workers)


def local_segments(run_dir: str, worker: str) -> WorkerSegments:
    """:class:`WorkerSegments` of a local run directory."""

    def list_names(relpath: str) -> List[str]:
        try:
            return os.listdir(os.path.join(run_dir, relpath))
        except OSError:
            return []

    def read_file(relpath: str) -> bytes:
        path = os.path.join(run_dir, relpath)
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_STORE_FILE_BYTES:
                raise OSError(f"{path} is {size} bytes, over the {MAX_STORE_FILE_BYTES} a run store file may hold")
            return fh.read(MAX_STORE_FILE_BYTES)

    return WorkerSegments(worker, list_names, read_file)


def rows_by_step(statistics, tensors) -> Dict[int, Tuple[list, list]]:
    """``{step: (statistics rows, tensors rows)}`` as Python dicts, in written order (the
    converter's view: whole steps, one at a time)."""
    out: Dict[int, Tuple[list, list]] = {}
    for which, table in ((0, statistics), (1, tensors)):
        for row in table.to_pylist():
            out.setdefault(row["step"], ([], []))[which].append(row)
    return out


def write_segment(run_dir: str, worker: str, segment: int, statistics, tensors) -> List[str]:
    """Seal a segment from its rows: its ``tensors`` file, then its ``statistics`` file (the
    seal), each written as ``.tmp`` and renamed (docs/format.md 10.4); returns their relpaths."""
    import pyarrow.parquet as pq

    statistics_schema, tensors_schema, _ = store.schemas()
    written = []
    for relpath, table, schema in ((store.tensors_relpath(worker, segment), tensors, tensors_schema),
                                   (store.statistics_relpath(worker, segment), statistics, statistics_schema)):
        path = os.path.join(run_dir, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        table = table.select(schema.names).unify_dictionaries() if table.num_rows else schema.empty_table()
        pq.write_table(table.cast(schema), path + ".tmp", **store.PARQUET_OPTIONS)
        os.replace(path + ".tmp", path)
        written.append(relpath)
    return written


def seal_left_live_segments(run_dir: str, worker: Optional[str] = None) -> List[str]:
    """Seal the live segments a killed writer left in a local run directory (or a spool): each
    becomes the Parquet files of its complete batches, and its live file goes. What a reader
    of the live file saw stays readable, and can now be uploaded (live files never are).
    ``worker``: only that worker's. Returns the relpaths written."""
    written = []
    for name in ([worker] if worker is not None else local_workers(run_dir)):
        segments = local_segments(run_dir, name)
        for segment in segments.segments()[1]:
            relpath = store.live_relpath(name, segment)
            try:
                with open(os.path.join(run_dir, relpath), "rb") as fh:
                    data = fh.read(MAX_STORE_FILE_BYTES)
            except OSError:
                continue
            statistics, tensors = split_live(read_live(data, relpath))
            written += write_segment(run_dir, name, segment, statistics, tensors)
            os.remove(os.path.join(run_dir, relpath))
    return written

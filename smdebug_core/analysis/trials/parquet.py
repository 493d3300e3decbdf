"""The long table (:class:`~.table.Table`) as Parquet, with pyarrow (the ``parquet`` extra):
one file, or a directory partitioned by worker and mode that DuckDB, Polars or Spark read
without smdebug (``Trial.to_parquet``, ``smdebug export RUN --format parquet -o DIR``).

The directory is Hive-partitioned: ``worker=<name>/mode=<MODE>/part-0.parquet``, the worker
URL-quoted (TensorFlow device names hold ``/``). The files hold the other columns (``step``,
``mode_step``, ``tensor``, ``reduction``, ``value``); readers take ``worker`` and ``mode`` from
the paths (DuckDB ``hive_partitioning``, Polars ``hive_partitioning=True``). It is written a
group of workers at a time (about :data:`CHUNK_RECORDS` records, one worker at least): memory
holds that group's rows, never the whole run's. A URL
(``s3://bucket/prefix``) is written through fsspec, as runs are read (the ``s3`` extra).
"""
from __future__ import annotations

import os
from typing import List, Tuple
from urllib.parse import quote

import numpy as np

from .table import COLUMNS, Table, require_optional

#: The Hive partition columns, outermost first.
PARTITIONS = ("worker", "mode")
#: Records read into memory at a time (about 40 bytes a row in the table): workers are
#: exported in groups of about this many, one worker at least.
CHUNK_RECORDS = 4_000_000
_FILE = "part-0.parquet"


def require_pyarrow(what: str):
    """The pyarrow module, or ImportError saying how to install it (pyarrow.parquet loaded
    here: a broken install fails here, not mid-export)."""
    require_optional("pyarrow.parquet", what, '".[parquet]"', "parquet")
    return require_optional("pyarrow", what, '".[parquet]"', "parquet")


def arrow_table(table: Table, columns=COLUMNS):
    """``columns`` of the table as a pyarrow Table: numbers as they are, texts dictionary-encoded."""
    pa = require_pyarrow("Parquet export")
    return pa.table(table.encoded(columns, lambda codes, categories: pa.DictionaryArray.from_arrays(
        pa.array(codes.astype(np.int32), pa.int32()), pa.array(categories, pa.string()))))


def write_file(table: Table, path: str) -> None:
    """The whole table to one Parquet file."""
    import pyarrow.parquet as pq

    _write_atomically(arrow_table(table), path, pq)


def _write_atomically(data, path: str, pq) -> None:
    # A reader listing the directory meanwhile never sees half a file.
    tmp = path + ".tmp"
    pq.write_table(data, tmp)
    os.replace(tmp, path)


def _rows(table: Table, keep: np.ndarray) -> Table:
    numbers = {k: v[keep] for k, v in table.numbers.items()}
    texts = {k: (codes[keep], categories) for k, (codes, categories) in table.texts.items()}
    return Table(numbers, texts)


class _Directory:
    """Where the partitions go: a local directory (files renamed into place whole) or a URL
    (objects appear whole when written)."""

    def __init__(self, directory: str):
        from ...storage.remote import filesystem, is_url

        self.name = directory
        self.fs, self.root = filesystem(directory) if is_url(directory) else (None, directory)

    def check_unused(self) -> None:
        if self.fs is None:
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise FileExistsError(f"{self.name} is a file: give a directory for the partitioned Parquet files")
            used = os.path.isdir(self.root) and os.listdir(self.root)
        else:
            used = self.fs.exists(self.root) and (not self.fs.isdir(self.root) or self.fs.ls(self.root))
        if used:
            raise FileExistsError(f"{self.name} is not empty: give a new or empty directory for the Parquet files "
                                  "(partitions of an earlier export would mix with these)")
        if self.fs is None:
            os.makedirs(self.root, exist_ok=True)

    def write(self, data, relpath: str, pq) -> str:
        if self.fs is None:
            path = os.path.join(self.root, *relpath.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write_atomically(data, path, pq)
            return path
        path = f"{self.root}/{relpath}"
        with self.fs.open(path, "wb") as fh:
            pq.write_table(data, fh)
        return f"{self.name.rstrip('/')}/{relpath}"


def _worker_chunks(trial, workers: List[str], chunk_records: int) -> List[List[str]]:
    """``workers`` in groups whose records (an upper bound of their rows) stay under
    ``chunk_records`` where they can: one table read per group instead of per worker."""
    log = trial._index.log
    per_worker = np.bincount(log.arrays()["worker"], minlength=len(log.workers.items))
    records = {name: int(per_worker[i]) for i, name in enumerate(log.workers.items)}
    chunks: List[List[str]] = []
    size = 0
    for worker in workers:
        n = records.get(worker, 0)
        if not chunks or size + n > chunk_records:
            chunks.append([])
            size = 0
        chunks[-1].append(worker)
        size += n
    return chunks


def _groups(table: Table):
    """``(worker, mode, rows)`` of the table: rows in the table's order within each group."""
    w_codes, w_names = table.texts["worker"]
    m_codes, m_names = table.texts["mode"]
    order = np.lexsort((m_codes, w_codes))  # stable: each group keeps tensor, reduction, step order
    key = w_codes[order].astype(np.int64) * len(m_names) + m_codes[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(key)]
    for start, end in zip(starts.tolist(), ends.tolist()):
        rows = order[start:end]
        yield w_names[w_codes[rows[0]]], m_names[m_codes[rows[0]]], rows


def write_partitioned(trial, directory: str, chunk_records: int = CHUNK_RECORDS, **select) -> List[Tuple[str, int]]:
    """The selected rows (``select``: ``Trial.to_table``'s arguments, ``workers`` among them)
    into ``directory`` (a path or URL), which must be new or empty; returns the files written
    and their numbers of rows. Workers are read in groups of about ``chunk_records`` records
    (one worker at least): that bounds the memory used."""
    require_pyarrow("Trial.to_parquet")
    import pyarrow.parquet as pq

    target = _Directory(os.fspath(directory))
    target.check_unused()
    workers = select.pop("workers", None)
    workers = trial.workers() if workers is None else [workers] if isinstance(workers, str) else list(workers)
    inner = [c for c in COLUMNS if c not in PARTITIONS]
    written = []
    for chunk in _worker_chunks(trial, workers, chunk_records):
        table = trial.to_table(workers=chunk, **select)
        for worker, mode, rows in _groups(table):
            relpath = f"worker={quote(worker, safe='')}/mode={mode}/{_FILE}"
            written.append((target.write(arrow_table(_rows(table, rows), inner), relpath, pq), len(rows)))
        del table
    return written

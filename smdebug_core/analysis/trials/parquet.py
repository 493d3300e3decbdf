"""The long table (:class:`~.table.Table`) as Parquet, with pyarrow (the ``parquet`` extra):
one file, or a directory partitioned by worker and mode that DuckDB, Polars or Spark read
without smdebug (``Trial.to_parquet``, ``smdebug export RUN --format parquet -o DIR``).

The directory is Hive-partitioned: ``worker=<name>/mode=<MODE>/part-0.parquet``, the worker
URL-quoted (TensorFlow device names hold ``/``). The files hold the other columns (``step``,
``mode_step``, ``tensor``, ``reduction``, ``value``); readers take ``worker`` and ``mode`` from
the paths (DuckDB ``hive_partitioning``, Polars ``hive_partitioning=True``). It is written one
worker at a time: memory holds one worker's rows, never the whole run's.
"""
from __future__ import annotations

import os
from typing import List
from urllib.parse import quote

import numpy as np

from .table import COLUMNS, Table

#: The Hive partition columns, outermost first.
PARTITIONS = ("worker", "mode")
_FILE = "part-0.parquet"


def require_pyarrow(what: str):
    """The pyarrow module, or ImportError saying how to install it."""
    try:
        import pyarrow
        import pyarrow.parquet  # loaded here: a broken install fails here, not mid-export
    except ImportError:
        raise ImportError(f"{what} needs pyarrow, which is not installed: pip install \".[parquet]\" "
                          "(smdebug-core's 'parquet' extra; pip install pyarrow works too)") from None
    return pyarrow


def arrow_table(table: Table, columns=COLUMNS):
    """``columns`` of the table as a pyarrow Table: numbers as they are, texts dictionary-encoded."""
    pa = require_pyarrow("Parquet export")
    out = {}
    for name in columns:
        if name in table.numbers:
            out[name] = table.numbers[name]
        else:
            codes, categories = table.texts[name]
            out[name] = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), pa.int32()),
                                                       pa.array(categories, pa.string()))
    return pa.table(out)


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


def write_partitioned(trial, directory: str, **select) -> List[str]:
    """The selected rows (``select``: ``Trial.to_table``'s arguments, ``workers`` among them)
    into ``directory``, which must be new or empty; returns the files written."""
    require_pyarrow("Trial.to_parquet")
    import pyarrow.parquet as pq

    directory = os.fspath(directory)
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory} is not empty: give a new or empty directory for the Parquet files "
                              "(partitions of an earlier export would mix with these)")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise FileExistsError(f"{directory} is a file: give a directory for the partitioned Parquet files")
    os.makedirs(directory, exist_ok=True)
    workers = select.pop("workers", None)
    workers = trial.workers() if workers is None else [workers] if isinstance(workers, str) else list(workers)
    inner = [c for c in COLUMNS if c not in PARTITIONS]
    written = []
    for worker in workers:
        table = trial.to_table(workers=[worker], **select)
        if not len(table):
            continue
        codes, modes = table.texts["mode"]
        for k, mode in enumerate(modes):
            keep = codes == k
            if not keep.any():
                continue
            folder = os.path.join(directory, f"worker={quote(worker, safe='')}", f"mode={mode}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, _FILE)
            _write_atomically(arrow_table(_rows(table, keep), inner), path, pq)
            written.append(path)
        del table
    return written

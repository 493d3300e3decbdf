"""``Trial.sql``: DuckDB over a run (docs/format.md 10), e.g. ``trial.sql("SELECT tensor,
max(value) FROM statistics WHERE reduction = 'l2' GROUP BY tensor").df()``.

Views: ``statistics``, one row per scalar or saved reduction value (the columns of
``to_dataframe``, plus ``dtype``, ``ndim`` and, for sealed segments, ``wall_time``) and, for a
run store, ``tensors``, where each whole tensor's record lies. A run store's sealed segments
are read by DuckDB from their Parquet files as they are (rows a later step replaced
included), the worker from their Hive folders; the segments still being written (and every
segment of a remote run) come from what the trial read, as arrow tables. A run in smdebug
1.0.34's layout gives ``Trial.to_table``'s rows."""
from __future__ import annotations

import numpy as np

from ...storage.format import store
from .store_columns import MODE_BY_VALUE
from .table import COLUMNS, require_optional


def run_sql(trial, query: str):
    """DuckDB's relation for ``query`` over the views of ``trial`` (see ``Trial.sql``)."""
    duckdb = require_optional("duckdb", "Trial.sql", "duckdb", "sql")
    trial._maybe_refresh()
    con = trial.__dict__.get("_duckdb")
    if con is None:
        con = trial._duckdb = duckdb.connect()
    if trial._layout == store.STORE_LAYOUT:
        statistics_files, tensors_files, rows = sql_sources(trial._index)
        for name, files in (("statistics", statistics_files), ("tensors", tensors_files)):
            con.register(f"_smdebug_{name}", rows[name])
            parts = [f"SELECT * FROM _smdebug_{name}"]
            if files:
                listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                # The worker as the trial names it: a TensorFlow device name's folder is its
                # serialized name (paths.worker_from_name).
                parts.insert(0, "SELECT * REPLACE (CASE WHEN starts_with(worker, '_') THEN "
                                "replace(replace(worker, '_', '/'), '-', ':') ELSE worker END AS worker) "
                                f"FROM read_parquet([{listed}], hive_partitioning = true, "
                                "hive_types = {'worker': VARCHAR})")
            con.execute(f"CREATE OR REPLACE VIEW {name} AS " + " UNION ALL BY NAME ".join(parts))
    else:
        from .parquet import arrow_table

        con.register("_smdebug_statistics", arrow_table(trial.to_table(show_incomplete_steps=True), list(COLUMNS)))
        con.execute("CREATE OR REPLACE VIEW statistics AS SELECT * FROM _smdebug_statistics")
    return con.sql(query)


def sql_sources(index):
    """What ``Trial.sql`` puts in its views: ``(statistics files, tensors files, rows)``: the
    local Parquet files of the sealed segments read (paths), and as arrow tables
    ``{"statistics": ..., "tensors": ...}`` the rows of every other segment (live ones;
    all of a remote run's), a ``worker`` column added as the Hive folders give it."""
    local = not getattr(index.storage, "remote", False)
    statistics_files, tensors_files, others = [], [], []
    for part in index.loaded_parts():
        if local and part.sealed:
            statistics_files.append(index.storage.local_path(part.source))
            relpath = store.tensors_relpath(part.folder, part.number)
            if relpath not in index._warned:
                tensors_files.append(index.storage.local_path(relpath))
        else:
            others.append(part)
    return statistics_files, tensors_files, {"statistics": _arrow_statistics(index, others),
                                             "tensors": _arrow_tensors(index, others)}

def _arrow_statistics(index, parts):
    import pyarrow as pa

    def texts(codes, items):
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(items, pa.string()))

    pieces = [p for p in parts if len(p)]
    cat = (lambda name: np.concatenate([getattr(p, name) for p in pieces])) if pieces else \
        (lambda name: np.zeros(0, np.int64))
    mode_names = [m.name if m is not None else "" for m in (MODE_BY_VALUE.get(v) for v in range(8))]
    return pa.table({
        "step": pa.array(cat("step"), pa.int64()),
        "mode": texts(cat("mode").astype(np.int32), mode_names),
        "mode_step": pa.array(cat("mode_step"), pa.int64()),
        "tensor": texts(cat("tensor").astype(np.int32), index.names.items),
        "reduction": texts(cat("label").astype(np.int32), index.labels.items),
        "value": pa.array(cat("value").astype(np.float64), pa.float64()),
        "dtype": texts(cat("dtype").astype(np.int32), index.dtypes.items),
        "ndim": pa.array(cat("ndim").astype(np.int8), pa.int8()),
        "wall_time": pa.nulls(sum(len(p) for p in pieces), pa.float64()),
        "worker": texts(np.repeat(np.asarray([p.worker_id for p in pieces], np.int32),
                                  [len(p) for p in pieces]), index.workers.items),
    })

def _arrow_tensors(index, parts):
    import pyarrow as pa

    rows = [(part.worker,) + row for part in parts for row in part.tensor_rows]
    names = ("worker", "step", "mode", "mode_step", "tensor", "kind", "file", "offset", "length", "crc32c",
             "dtype", "shape", "placement")
    columns = list(zip(*rows)) if rows else [()] * len(names)
    data = dict(zip(names, columns))
    data["mode"] = [MODE_BY_VALUE[m].name for m in data["mode"]]
    types = {"step": pa.int64(), "mode_step": pa.int64(), "offset": pa.int64(), "length": pa.int64(),
             "crc32c": pa.int64(), "shape": pa.list_(pa.int64())}
    return pa.table({name: pa.array(list(data[name]), types.get(name, pa.string())) for name in names})

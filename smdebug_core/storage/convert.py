"""Converting a run between its two layouts (docs/format.md 10.6), both ways, losslessly.

Each step of the source is read whole and handed to the other layout's writer as a
:class:`StepData`, as the hook would have handed it: a converted run is what a hook with the
other layout would have written, and each writer stays the only place its bytes are made.
The collections files, the end-of-job marker and the flight recorder's markers are copied.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Iterator, Optional

import numpy as np

from ..exceptions import ConfigError
from ..layouts import LAYOUT_1034, STORE_LAYOUT
from ..modes import ModeKeys
from .format import layout, store
from .format.codec import decode_tensor_event
from .format.index import PLACEMENTS_KEY, parse_index_json
from .format.records import read_record
from .step_data import StepData

#: What ``--to`` accepts, and the layout each names.
TARGETS = {"1.0.34": LAYOUT_1034, LAYOUT_1034: LAYOUT_1034, STORE_LAYOUT: STORE_LAYOUT}


def layout_of(run_dir: str) -> str:
    """The layout of a local run directory; ConfigError for a mixed or an empty one."""
    has_store = os.path.isdir(os.path.join(run_dir, store.STORE_DIR))
    has_1034 = any(os.path.isdir(os.path.join(run_dir, d)) for d in (layout.INDEX_DIR, layout.EVENTS_DIR))
    if has_store and has_1034:
        raise ConfigError(f"{run_dir} mixes layouts: it holds store/ and index/ or events/ (two runs written into "
                          "one directory?); move one of them out")
    if has_store:
        return STORE_LAYOUT
    if has_1034:
        return LAYOUT_1034
    raise ConfigError(f"{run_dir} holds no steps in either layout (no store/, index/ or events/)")


def convert(run_dir: str, out_dir: str, to: str, progress: Optional[Callable[[int], None]] = None) -> int:
    """Write the run at ``run_dir`` into ``out_dir`` in layout ``to``; returns the steps written.
    ``progress(n)`` is called as steps are written."""
    from .writer import RunWriter

    target = TARGETS.get(to)
    if target is None:
        raise ConfigError(f"--to must be one of {', '.join(TARGETS)}, got {to!r}")
    source = layout_of(run_dir)
    if source == target:
        raise ConfigError(f"{run_dir} is already in the {target!r} layout")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ConfigError(f"{out_dir} is not empty: give a new directory for the converted run")
    steps = _store_steps(run_dir) if source == STORE_LAYOUT else _index_steps(run_dir)
    writers = {}
    count = 0
    try:
        for data in steps:
            writer = writers.get(data.worker)
            if writer is None:
                writer = writers[data.worker] = RunWriter(out_dir, data.worker, run_layout=target)
            writer.submit(data, publish=True)
            count += 1
            if progress is not None:
                progress(1)
    finally:
        for writer in writers.values():
            writer.close(write_end_marker=False)
    failed = [w for w in writers.values() if w.failed is not None]
    if failed:
        raise OSError(f"writing {out_dir} failed: {failed[0].failed}")
    _copy_run_files(run_dir, out_dir)
    return count


def _copy_run_files(run_dir: str, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for entry in ("collections", layout.MARKER_DIR):
        src = os.path.join(run_dir, entry)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(out_dir, entry), dirs_exist_ok=True)
    if os.path.exists(os.path.join(run_dir, layout.END_OF_JOB_FILE)):
        open(os.path.join(out_dir, layout.END_OF_JOB_FILE), "wb").close()


# ---------------------------------------------------------------- reading a run store

def _store_steps(run_dir: str) -> Iterator[StepData]:
    from .store_rows import local_segments, local_workers, rows_by_step

    for worker in local_workers(run_dir):
        statistics, tensors = local_segments(run_dir, worker).all_rows()
        for step, (stat_rows, tensor_rows) in sorted(rows_by_step(statistics, tensors).items()):
            yield _store_step(run_dir, worker, step, stat_rows, tensor_rows)


def _store_step(run_dir: str, worker: str, step: int, stat_rows: list, tensor_rows: list) -> StepData:
    first = (stat_rows or tensor_rows)[0]
    values = {}  # tag -> value; the last row of a name counts (docs/format.md 10.2)
    for row in stat_rows:
        tag = row["tensor"] if not row["reduction"] else \
            f"smdebug/reductions/{row['reduction']}/{row['tensor']}"
        values[tag] = np.array(row["value"], dtype=_dtype(row["dtype"])).reshape((1,) * row["ndim"])
    shapes, placements = [], {}
    for row in tensor_rows:
        if row["kind"] == store.KIND_SHAPE:
            shapes.append((row["tensor"], row["original_name"] or row["tensor"], tuple(row["shape"])))
            continue
        with open(os.path.join(run_dir, row["file"]), "rb") as fh:
            fh.seek(row["offset"])
            data = fh.read(row["length"])
        payload, _ = read_record(memoryview(data), 0, "full")
        values[row["tensor"]] = decode_tensor_event(payload).value
        if row["placement"]:
            placements[row["tensor"]] = json.loads(row["placement"])
    return StepData(step, ModeKeys[first["mode"]], first["mode_step"], worker, tensors=list(values.items()),
                    shapes=shapes, wall_time=first["wall_time"], placements=placements)


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ---------------------------------------------------------------- reading the 1.0.34 layout

def _index_steps(run_dir: str) -> Iterator[StepData]:
    index_dir = os.path.join(run_dir, layout.INDEX_DIR)
    for bucket in sorted(os.listdir(index_dir)) if os.path.isdir(index_dir) else []:
        for name in sorted(os.listdir(os.path.join(index_dir, bucket))):
            if not name.endswith(layout.INDEX_FILE_SUFFIX):
                continue
            path = os.path.join(index_dir, bucket, name)
            step, worker = layout.parse_step_and_worker(name)
            with open(path, "rb") as fh:
                raw = fh.read(layout.MAX_INDEX_FILE_BYTES)
            parsed = parse_index_json(raw, path)
            tensors, wall_time = [], None
            if parsed.tensors:
                with open(os.path.join(run_dir, parsed.event_file_name), "rb") as fh:
                    for entry in parsed.tensors:
                        fh.seek(entry.start_idx)
                        payload, _ = read_record(memoryview(fh.read(entry.length)), 0, "full")
                        decoded = decode_tensor_event(payload)
                        wall_time = decoded.wall_time if wall_time is None else wall_time
                        tensors.append((entry.name, decoded.value))
            shapes = [(n, original or n, tuple(dims))
                      for (n, dims), original in zip(parsed.shapes, parsed.shape_original_names)]
            placements = json.loads(raw).get(PLACEMENTS_KEY) or {}
            yield StepData(step, parsed.mode, parsed.mode_step, worker, tensors=tensors, shapes=shapes,
                           wall_time=wall_time if wall_time is not None else os.path.getmtime(path),
                           placements=placements)

"""Is an output directory's content a previous run, or this job's other workers at work?

With ``include_workers="all"``, every worker writes into the same directory and nothing
makes them start in lockstep: a worker may save its first step before the chief has even
created its hook. The chief refuses a directory that already holds a run (or, with
``overwrite``, deletes it); files written by the other ranks of its own job are neither.

With ``overwrite``, what tells the two apart is the file's name and time: a file of another
worker of this job, last modified since this process started, may be that worker's first
step; everything else is the earlier run's (:func:`is_previous_run`).
"""
from __future__ import annotations

import json
import os
import stat
import time
from typing import Iterable, Iterator, Optional, Set

from .format import layout, store

_IMPORTED_AT = time.time()


def job_start_time() -> float:
    """When this process started (seconds since the epoch).

    The ranks of one job are started together (torchrun, mpirun, SageMaker), and each
    spends seconds importing its framework before it writes a step, so a file modified
    before this instant is not this job's. Linux gives the process start exactly; elsewhere
    the time smdebug was imported stands in (a little later: a sibling's step written in
    between would count as old).
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            # Field 22 (starttime, clock ticks since boot) follows the ")" that ends field 2.
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        started = time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT
    return min(started, _IMPORTED_AT)


def written_by(file_name: str) -> Optional[str]:
    """The worker an index, event or collections file is named after, or None."""
    for parse in (lambda n: layout.parse_step_and_worker(n)[1], layout.parse_collections_worker):
        try:
            return parse(file_name)
        except ValueError:
            continue
    return None


def store_worker(path: str) -> Optional[str]:
    """The worker whose partition folder (``worker=<name>``, docs/format.md 10) holds ``path``, or None."""
    for part in reversed(path.replace(os.sep, "/").split("/")[:-1]):
        worker = store.worker_of_dir(part)
        if worker is not None:
            return worker
    return None


def is_previous_run(file_name: str, modified: float, siblings: Set[str], job_start: float,
                    path: str = "") -> bool:
    """With ``overwrite``: is this file the earlier run's (to delete)? Everything is, except
    the files of this job's other workers (named after one of ``siblings``, or in one of their
    run store folders, modified since ``job_start``), and the run store's layout file when
    one of them wrote it."""
    if modified < job_start:
        return True
    if file_name == store.LAYOUT_FILE.rpartition("/")[2]:
        return not siblings
    return (written_by(file_name) or store_worker(path)) not in siblings


def remove_previous_run(out_dir: str, entries: Iterable[str], siblings: Iterable[str]) -> None:
    """Delete the earlier run under ``out_dir/<entry>`` (see :func:`is_previous_run`) and the
    directories this leaves empty."""
    siblings = set(siblings)
    job_start = job_start_time() if siblings else float("inf")
    for entry in entries:
        path = os.path.join(out_dir, entry)
        if os.path.islink(path) or not os.path.isdir(path):
            if os.path.lexists(path):
                os.remove(path)
            continue
        for top, dirs, files in os.walk(path, topdown=False):
            for name in files:
                file_path = os.path.join(top, name)
                if is_previous_run(name, os.lstat(file_path).st_mtime, siblings, job_start, file_path):
                    os.remove(file_path)
            for name in dirs:
                try:
                    os.rmdir(os.path.join(top, name))
                except OSError:  # not empty: a sibling's files are in it
                    pass
        try:
            os.rmdir(path)
        except OSError:
            pass


def _names(directory: str) -> Iterator[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            yield from it
    except (FileNotFoundError, NotADirectoryError):
        return


def _num_workers(path: str) -> Optional[int]:
    """``_meta.num_workers`` of a collections file, or None if it is not readable as one."""
    try:
        # Non-blocking and regular files only: a FIFO here must not hang the chief's start.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > layout.MAX_COLLECTIONS_FILE_BYTES:
            return None
        doc = json.loads(os.read(fd, layout.MAX_COLLECTIONS_FILE_BYTES))
        value = doc["_meta"]["num_workers"]
        return value if isinstance(value, int) else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    finally:
        os.close(fd)


def written_by_other_workers(out_dir: str, workers: Iterable[str], world_size: int) -> bool:
    """Whether every smdebug file in ``out_dir`` was written by one of ``workers`` (the other
    ranks of this job) and the run has not ended: no end-of-job marker, every collections
    file says ``world_size`` workers, every index and event file is named after one of
    ``workers``. Files still being written (``*.tmp``) and empty directories hold no run.
    One file of any other worker (this rank's own, from a previous run) or of another
    world size: False.
    """
    siblings: Set[str] = set(workers)
    if os.path.lexists(os.path.join(out_dir, layout.END_OF_JOB_FILE)):
        return False
    for entry in _names(layout.join_under(out_dir, layout.COLLECTIONS_DIR)):
        if entry.name.endswith(layout.TMP_SUFFIX):
            continue
        try:
            worker = layout.parse_collections_worker(entry.name)
        except ValueError:
            return False
        if worker not in siblings or _num_workers(entry.path) != world_size:
            return False
    for top in (store.STATISTICS_DIR, store.TENSORS_DIR, store.CHUNKS_DIR, store.LIVE_DIR):
        for partition in _names(os.path.join(out_dir, top)):
            if store.worker_of_dir(partition.name) not in siblings:
                return False
    for top in (layout.INDEX_DIR, layout.EVENTS_DIR):
        for bucket in _names(os.path.join(out_dir, top)):
            for entry in _names(bucket.path):
                if entry.name.endswith(layout.TMP_SUFFIX):
                    continue
                try:
                    _, worker = layout.parse_step_and_worker(entry.name)
                except ValueError:
                    return False
                if worker not in siblings:
                    return False
    return True

"""Is an output directory's content a previous run, or this job's other workers at work?

With ``include_workers="all"``, every worker writes into the same directory and nothing
makes them start in lockstep: a worker may save its first step before the chief has even
created its hook. The chief refuses a directory that already holds a run (or, with
``overwrite``, deletes it); files written by the other ranks of its own job are neither.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Iterable, Iterator, Optional, Set

from ..format import layout

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

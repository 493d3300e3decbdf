"""Opening a run: checking that the trial's path is (or may become) a run directory, naming
the runs near a wrong path, and reading the collections files, waiting a bounded time for a
run that is still starting."""
from __future__ import annotations

import difflib
import logging
import os
import time
from typing import Iterable, List, Optional, Set, Tuple

from ...collections import CollectionManager
from ...exceptions import ConfigError, CorruptCollectionsFile, MissingCollectionFiles, RunNotFound, UnsafeRunFile
from ...storage.format.layout import (
    COLLECTIONS_DIR,
    COLLECTIONS_SUFFIX,
    END_OF_JOB_FILE,
    EVENTS_DIR,
    INDEX_DIR,
    MAX_COLLECTIONS_FILE_BYTES,
)
from ...storage.format.store import STORE_DIR
from .paths import worker_from_name

logger = logging.getLogger("smdebug.trials")

#: How deep, and through how many directories, runs are looked for below a folder to name them.
_RUN_SEARCH_DEPTH = 3
_RUN_SEARCH_MAX_DIRS = 2000
_RUN_SEARCH_SHOWN = 10


def _is_run_dir(path: str) -> bool:
    return any(os.path.isdir(os.path.join(path, d)) for d in (COLLECTIONS_DIR, INDEX_DIR, STORE_DIR))


def runs_below(folder: str, depth: int = _RUN_SEARCH_DEPTH, limit: int = 50) -> List[str]:
    """Run directories (with ``collections/``, ``index/`` or ``store/``) below ``folder``, sorted, bounded."""
    found: List[str] = []
    level = [folder]
    scanned = 0
    for _ in range(depth):
        deeper = []
        for parent in level:
            scanned += 1
            if scanned > _RUN_SEARCH_MAX_DIRS:  # a home directory, not a folder of runs
                return sorted(found)
            try:
                with os.scandir(parent) as entries:
                    subdirs = sorted(e.path for e in entries if e.is_dir() and not e.name.startswith("."))
            except OSError:
                continue
            for sub in subdirs:
                if _is_run_dir(sub):
                    found.append(sub)
                elif os.path.basename(sub) not in (EVENTS_DIR, "tensorboard"):
                    deeper.append(sub)
            if len(found) >= limit:
                return sorted(found)
        level = deeper
    return sorted(found)


def _runs_hint(folder: str, near: Optional[str] = None) -> str:
    """The runs below ``folder``; with ``near`` (a path that does not exist), the most alike first."""
    runs = [os.path.relpath(r, folder) for r in runs_below(folder)]
    if not runs:
        return ""
    label = f"runs found below {folder}"
    if near is not None:
        wanted = os.path.relpath(near, folder)
        runs.sort(key=lambda r: -difflib.SequenceMatcher(None, wanted, r).ratio())
        label += ", the closest first"
    shown = ", ".join(runs[:_RUN_SEARCH_SHOWN])
    more = f" and {len(runs) - _RUN_SEARCH_SHOWN} more" if len(runs) > _RUN_SEARCH_SHOWN else ""
    return f"; {label}: {shown}{more}"


def _tensorboard_hint(path: str) -> str:
    """What to say of a folder that holds TensorBoard event files and no run (a run's tensorboard/)."""
    try:
        for dirpath, _, files in os.walk(path):
            if dirpath[len(path):].count(os.sep) > 2:
                break
            if any("tfevents" in f for f in files):
                parent = os.path.dirname(os.path.abspath(path))
                run = f"; the run is {parent}: open that" if _is_run_dir(parent) else ""
                return (f"{path} holds TensorBoard event files, not a run (view them with: tensorboard --logdir "
                        f"{path}){run}")
    except OSError:
        return ""
    return ""


def _waiting_time(seconds: float) -> str:
    return "with no time limit" if seconds == float("inf") else f"up to {seconds:g} s"


def list_collection_files(storage) -> List[str]:
    """Names of the run's collections files, sorted."""
    return sorted(
        e.name
        for e in storage.list_dir(COLLECTIONS_DIR)
        if not e.is_dir and e.name.endswith(COLLECTIONS_SUFFIX) and len(e.name) > len(COLLECTIONS_SUFFIX)
    )


def _describe_run_directory(storage) -> str:
    index_buckets = [e.name for e in storage.list_dir(INDEX_DIR) if e.is_dir]
    index_files = sum(len(storage.list_dir(f"{INDEX_DIR}/{b}")) for b in index_buckets[:50])
    parts = [
        f"directory exists: {'yes' if storage.is_dir() else 'NO'}",
        f"index files: {index_files}{'+' if len(index_buckets) > 50 else ''}",
        f"events/ present: {'yes' if storage.is_dir(EVENTS_DIR) else 'no'}",
        f"{END_OF_JOB_FILE}: {'present' if storage.exists(END_OF_JOB_FILE) else 'absent'}",
    ]
    return "; ".join(parts)


def check_run_path(storage, path: str, wait_timeout: float, wait_for_directory: bool) -> None:
    """Fail at once on a path that is no run and cannot become one by waiting."""
    if getattr(storage, "remote", False):
        try:
            found = storage.is_dir()
        except Exception as exc:  # noqa: BLE001 - credentials, endpoint, permissions: say which
            raise RunNotFound(f"cannot list trial path {path}: {type(exc).__name__}: {exc}. Check the URL, "
                              "the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID...) and, for a non-AWS "
                              "endpoint, AWS_ENDPOINT_URL") from None
        if found:
            return
        if wait_for_directory and wait_timeout > 0:
            logger.warning("%s holds no objects yet: waiting %s for a training job to write there", path,
                           _waiting_time(wait_timeout))
            return
        raise RunNotFound(f"trial path {path} holds no objects. Check the URL (and AWS_ENDPOINT_URL, "
                          "AWS_PROFILE for a non-default endpoint or account); to open a run before its job "
                          "writes anything, pass wait_timeout (seconds to wait for it)")
    if os.path.isdir(path):
        if not _is_run_dir(path) and not os.path.exists(os.path.join(path, END_OF_JOB_FILE)):
            tensorboard = _tensorboard_hint(path)
            if tensorboard:  # no run will appear here: do not wait for one
                raise RunNotFound(tensorboard)
            hint = _runs_hint(path)
            if hint:  # a folder of runs, not a run that is about to start
                raise RunNotFound(f"{path} is not a run directory (no {COLLECTIONS_DIR}/ or {INDEX_DIR}/ in "
                                  f"it){hint}. Open one of them")
            if wait_timeout > 0:
                logger.warning("%s holds no run yet: waiting %s for a training job to write its collections "
                               "file (wait_timeout)", path, _waiting_time(wait_timeout))
        return
    if os.path.exists(path):
        raise RunNotFound(f"trial path {path} is a file, not a run directory")
    if wait_for_directory and wait_timeout > 0:
        logger.warning("%s does not exist yet: waiting %s for a training job to create it", path,
                       _waiting_time(wait_timeout))
        return
    ancestor = os.path.dirname(path)
    while ancestor and not os.path.isdir(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    hint = _runs_hint(ancestor, near=path) if os.path.isdir(ancestor) and ancestor != os.path.dirname(ancestor) else ""
    raise RunNotFound(f"trial path {path} does not exist{hint}. Check the path; to open a run before its "
                      "job creates the directory, pass wait_timeout (seconds to wait for it)")


def load_collections(storage, path: str, wait_timeout: float,
                     poll_interval: float) -> Tuple[CollectionManager, int, List[str]]:
    """Read the first collections file, then wait (bounded) for every worker's one:
    ``(collections, number of workers, collections files)``."""
    deadline = time.monotonic() + wait_timeout
    coll_dir = storage.local_path(COLLECTIONS_DIR)
    files = list_collection_files(storage)
    while not files:
        if storage.exists(END_OF_JOB_FILE):
            raise MissingCollectionFiles(
                f"training has ended ({END_OF_JOB_FILE} exists) but there is no "
                f"'*{COLLECTIONS_SUFFIX}' file in {coll_dir} ({_describe_run_directory(storage)})"
            )
        if time.monotonic() >= deadline:
            raise MissingCollectionFiles(
                f"no '*{COLLECTIONS_SUFFIX}' file appeared in {coll_dir} within "
                f"{wait_timeout:g} s ({_describe_run_directory(storage)}). Is the path right? "
                "A running job writes its collections file after its first saved step; "
                "pass a larger wait_timeout (or set SMDEBUG_TRIAL_WAIT_TIMEOUT) to wait longer"
            )
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        files = list_collection_files(storage)

    first = f"{COLLECTIONS_DIR}/{files[0]}"
    try:
        data = storage.read_file(first, max_bytes=MAX_COLLECTIONS_FILE_BYTES)
        manager, num_workers = CollectionManager.from_json(data, untrusted=True)
    except UnsafeRunFile as exc:
        raise CorruptCollectionsFile(str(exc)) from None
    except (ConfigError, ValueError, RecursionError) as exc:
        raise CorruptCollectionsFile(f"{storage.local_path(first)}: {exc}") from None
    except FileNotFoundError:
        raise CorruptCollectionsFile(f"{storage.local_path(first)} vanished while being read") from None

    while len(files) < num_workers:
        if storage.exists(END_OF_JOB_FILE):
            logger.warning(
                "%s: training ended with %d of %d workers' collections files; reading what there is",
                path, len(files), num_workers,
            )
            break
        if time.monotonic() >= deadline:
            raise MissingCollectionFiles(
                f"{files[0]} says the run has {num_workers} workers, but only {len(files)} "
                f"collections file(s) ({', '.join(files)}) appeared in {coll_dir} within "
                f"{wait_timeout:g} s; pass a larger wait_timeout to wait longer"
            )
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        files = list_collection_files(storage)
    return manager, num_workers, files


def collection_workers(collection_files: Iterable[str]) -> Set[str]:
    """The workers the collections files are of."""
    return {worker_from_name(f[: -len(COLLECTIONS_SUFFIX)]) for f in collection_files}

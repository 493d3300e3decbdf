"""The Trial: a read-only view of one run directory (docs/format.md section 5).

A trial discovers data only through the collections files and the index files; it opens
an event file only when a value is asked for. Index files are read incrementally: each
refresh lists the index buckets whose directory changed and parses only the files it has
not read before.
"""
from __future__ import annotations

import bisect
import enum
import gc
import logging
import numbers
import os
import sys
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from ...collections import Collection, CollectionManager
from ...exceptions import (
    ConfigError,
    CorruptCollectionsFile,
    IndexReaderException,
    MissingCollectionFiles,
    NoMoreData,
    RunNotFound,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    UnsafeRunFile,
)
from ...storage.format.codec import DEFAULT_MAX_EXPANDED_ELEMENTS
from ...storage.format.index import parse_index_json
from ...storage.format.layout import (
    COLLECTIONS_DIR,
    COLLECTIONS_SUFFIX,
    END_OF_JOB_FILE,
    EVENTS_DIR,
    INDEX_DIR,
    INDEX_FILE_SUFFIX,
    MAX_COLLECTIONS_FILE_BYTES,
    MAX_INDEX_FILE_BYTES,
    deserialize_worker_name,
    parse_step_and_worker,
    validate_step,
)
from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag
from .bulk import RecordLog
from .storage import open_storage
from .tensor import Tensor, TensorLocation

logger = logging.getLogger("smdebug.trials")

GLOBAL = ModeKeys.GLOBAL
_RECORD_CHECKS = ("minimal", "full", "none")
#: Index buckets hold the files of 1000 consecutive steps (docs/format.md 1.2).
_BUCKET_SPAN = 1000
#: A bucket whose directory changed less than this long ago is listed again even if its
#: mtime did not move: directory mtimes are coarse, a file renamed into the bucket in the
#: same clock tick as our last listing would otherwise be missed.
_RESCAN_GRACE_NS = 2_000_000_000
#: Show a progress bar for loads and reads bigger than these.
_PROGRESS_MIN_INDEX_FILES = 5000
DEFAULT_WAIT_TIMEOUT_S = 30.0
DEFAULT_POLL_INTERVAL_S = 0.5
DEFAULT_INCOMPLETE_STEP_WAIT_WINDOW = 1000
#: How deep, and through how many directories, runs are looked for below a folder to name them.
_RUN_SEARCH_DEPTH = 3
_RUN_SEARCH_MAX_DIRS = 2000
_RUN_SEARCH_SHOWN = 10


def _is_run_dir(path: str) -> bool:
    return any(os.path.isdir(os.path.join(path, d)) for d in (COLLECTIONS_DIR, INDEX_DIR))


def runs_below(folder: str, depth: int = _RUN_SEARCH_DEPTH, limit: int = 50) -> List[str]:
    """Run directories (with ``collections/`` or ``index/``) below ``folder``, sorted, bounded."""
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


def _runs_hint(folder: str) -> str:
    runs = runs_below(folder)
    if not runs:
        return ""
    shown = ", ".join(os.path.relpath(r, folder) for r in runs[:_RUN_SEARCH_SHOWN])
    more = f" and {len(runs) - _RUN_SEARCH_SHOWN} more" if len(runs) > _RUN_SEARCH_SHOWN else ""
    return f"; runs found below {folder}: {shown}{more}"


def _waiting_time(seconds: float) -> str:
    return "with no time limit" if seconds == float("inf") else f"up to {seconds:g} s"


def _steps_text(steps: List[int]) -> str:
    if not steps:
        return "none"
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:4]))}, ..., {', '.join(map(str, steps[-2:]))} ({len(steps)} steps)"


class StepState(enum.Enum):
    """Whether a step can be read now (``has_passed_step``)."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


def _env_number(names: Tuple[str, ...], default, parse):
    """First of ``names`` set in the environment, parsed; ``default`` if none is set."""
    for name in names:
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            value = parse(raw.strip())
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not a valid number") from None
        if value < 0:
            raise ValueError(f"environment variable {name}={raw!r} must not be negative")
        return value
    return default


def _progress_wanted(progress: Optional[bool]) -> bool:
    if progress is None:
        try:
            return sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


def _progress_bar(wanted: bool, total: int, desc: str):
    """A tqdm bar, or None when not wanted (or tqdm is missing)."""
    if not wanted:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a declared dependency
        return None
    return tqdm(total=total, desc=desc, unit="file", leave=False)


def _validate_range_steps(range_steps):
    if range_steps is None:
        return None
    if not isinstance(range_steps, (tuple, list)) or len(range_steps) != 2:
        raise ValueError(f"range_steps must be a (begin, end) pair, got {range_steps!r}")
    begin, end = range_steps
    begin = None if begin is None else validate_step(begin, "range_steps begin")
    end = None if end is None else validate_step(end, "range_steps end")
    if begin is not None and end is not None and end <= begin:
        raise ValueError(f"range_steps end must be greater than begin, got {range_steps!r}")
    return (begin, end)


def _worker_from_name(raw: str) -> str:
    # TensorFlow MirroredStrategy workers are serialized device names, which always
    # start with "/" and so are stored starting with "_" (docs/format.md 1.2). Only those are
    # deserialized; the original's "'__' anywhere in the path" test is a known bug.
    return deserialize_worker_name(raw) if raw.startswith("_") else raw


class Trial:
    """Everything one training run saved: steps, modes, workers, collections and tensors.

    Create it with :func:`create_trial`. Queries that list things (``steps()``,
    ``tensor_names()``, ``has_passed_step()``) pick up new files written since the last
    call; value lookups refresh only when what they ask for is not known yet.
    """

    def __init__(
        self,
        path: str,
        name: Optional[str] = None,
        range_steps=None,
        check: Union[bool, str] = False,
        index_mode: bool = True,
        cache: bool = False,
        wait_timeout: Optional[float] = None,
        progress: Optional[bool] = None,
        wait_for_directory: bool = False,
        max_expanded_elements: Optional[int] = None,
    ):
        if not index_mode:
            raise NotImplementedError(
                "index_mode=False (discovering tensors by reading whole event files) is not "
                "supported: index files are mandatory in the smdebug format"
            )
        self._storage = open_storage(path)
        self.path = self._storage.root
        self.name = name if name is not None else os.path.basename(self.path.rstrip("/")) or self.path
        self.range_steps = _validate_range_steps(range_steps)
        if check is True:
            self._record_check = "full"
        elif check is False or check is None:
            self._record_check = "minimal"
        elif check in _RECORD_CHECKS:
            self._record_check = check
        else:
            raise ValueError(f"check must be True, False or one of {_RECORD_CHECKS}, got {check!r}")
        self.check = check
        self.index_mode = True
        self.cache = bool(cache)
        if wait_timeout is None:
            wait_timeout = _env_number(("SMDEBUG_TRIAL_WAIT_TIMEOUT",), DEFAULT_WAIT_TIMEOUT_S, float)
        if not isinstance(wait_timeout, (int, float)) or isinstance(wait_timeout, bool) or not wait_timeout >= 0:
            raise ValueError(
                f"wait_timeout must be a non-negative number of seconds (math.inf: no limit), got {wait_timeout!r}"
            )
        self.wait_timeout = float(wait_timeout)
        if max_expanded_elements is None:
            max_expanded_elements = _env_number(("SMDEBUG_MAX_EXPANDED_ELEMENTS",), DEFAULT_MAX_EXPANDED_ELEMENTS, int)
        if not isinstance(max_expanded_elements, int) or isinstance(max_expanded_elements, bool) \
                or max_expanded_elements < 0:
            raise ValueError(f"max_expanded_elements must be a non-negative integer, got {max_expanded_elements!r}")
        self.max_expanded_elements = max_expanded_elements
        self.poll_interval = DEFAULT_POLL_INTERVAL_S
        self.progress = progress
        # Turned off by a caller that knows nothing new can appear (rule engines).
        self.dynamic_refresh = True

        window = _env_number(
            ("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "INCOMPLETE_STEP_WAIT_WINDOW"),
            DEFAULT_INCOMPLETE_STEP_WAIT_WINDOW,
            int,
        )
        self._incomplete_step_window = max(1, window)
        # The original always slept 1 s after seeing the end marker, "to let the last files
        # land". We check the marker *before* listing, and writers create it only after
        # every other file (docs/format.md 5.4), so that listing is already complete: no delay
        # unless one is asked for.
        self._training_end_delay = _env_number(
            ("SMDEBUG_TRAINING_END_DELAY_REFRESH", "TRAINING_END_DELAY_REFRESH"), 0.0, float
        )

        # --- state built from index files ---
        self._tensors: Dict[str, Tensor] = {}
        self._records = RecordLog()  # the same entries in columns, for bulk reads
        self._global_to_mode: Dict[int, Tuple[ModeKeys, int]] = {}
        self._mode_to_global: Dict[ModeKeys, Dict[int, int]] = {}
        self._workers_for_step: Dict[int, Set[str]] = {}
        self._tensors_for_step: Dict[int, Set[str]] = {}
        self._tensors_for_mode: Dict[ModeKeys, Set[str]] = {}
        self._sorted_steps: Optional[List[int]] = []
        self._sorted_mode_steps: Dict[ModeKeys, List[int]] = {}
        self.last_complete_step = -1
        self.loaded_all_steps = False
        self.num_workers = 0
        self._workers: Set[str] = set()
        # Incremental listing: files already read and the mtime seen, per index bucket.
        self._seen_index_files: Dict[str, Set[str]] = {}
        self._bucket_mtime: Dict[str, int] = {}
        self.corrupt_index_files: List[str] = []
        #: Global steps that workers number differently: ``{step: {worker: (mode, mode_step)}}``
        #: for the workers whose own numbering differs from the trial's (the first worker read).
        self.worker_step_conflicts: Dict[int, Dict[str, Tuple[ModeKeys, int]]] = {}
        self.stats: Dict[str, int] = self._storage.stats
        self.stats.update(index_files_parsed=0, refreshes=0)

        self._collection_manager: Optional[CollectionManager] = None
        self._check_path(wait_for_directory)
        self._load_collections()
        self.refresh(progress=progress)

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self):
        modes = ", ".join(f"{m.name} {len(self._all_steps_sorted(m))}" for m in
                          sorted(self._mode_to_global, key=lambda m: m.value))
        return (
            f"<Trial {self.name!r} at {self.path!r}: {len(self._global_to_mode)} steps"
            f"{f' ({modes})' if modes else ''}, {len(self._tensors)} tensors, "
            f"workers {', '.join(sorted(self._workers)) or 'none'}, "
            f"{'ended' if self.loaded_all_steps else 'not ended'}>"
        )

    def close(self) -> None:
        """Close the event files kept open for reading."""
        self._storage.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        storage = getattr(self, "_storage", None)
        if storage is not None:
            storage.close()

    @property
    def index_files_read(self) -> int:
        """How many index files this trial has parsed so far (each is read once)."""
        return self.stats["index_files_parsed"]

    # ------------------------------------------------------------------ collections
    def _list_collection_files(self) -> List[str]:
        return sorted(
            e.name
            for e in self._storage.list_dir(COLLECTIONS_DIR)
            if not e.is_dir and e.name.endswith(COLLECTIONS_SUFFIX) and len(e.name) > len(COLLECTIONS_SUFFIX)
        )

    def _describe_run_directory(self) -> str:
        index_buckets = [e.name for e in self._storage.list_dir(INDEX_DIR) if e.is_dir]
        index_files = sum(len(self._storage.list_dir(f"{INDEX_DIR}/{b}")) for b in index_buckets[:50])
        parts = [
            f"directory exists: {'yes' if self._storage.is_dir() else 'NO'}",
            f"index files: {index_files}{'+' if len(index_buckets) > 50 else ''}",
            f"events/ present: {'yes' if self._storage.is_dir(EVENTS_DIR) else 'no'}",
            f"{END_OF_JOB_FILE}: {'present' if self._storage.exists(END_OF_JOB_FILE) else 'absent'}",
        ]
        return "; ".join(parts)

    def _check_path(self, wait_for_directory: bool) -> None:
        """Fail at once on a path that is no run and cannot become one by waiting."""
        path = self.path
        if getattr(self._storage, "remote", False):
            try:
                found = self._storage.is_dir()
            except Exception as exc:  # noqa: BLE001 - credentials, endpoint, permissions: say which
                raise RunNotFound(f"cannot list trial path {path}: {type(exc).__name__}: {exc}. Check the URL, "
                                  "the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID...) and, for a non-AWS "
                                  "endpoint, AWS_ENDPOINT_URL") from None
            if found:
                return
            if wait_for_directory and self.wait_timeout > 0:
                logger.warning("%s holds no objects yet: waiting %s for a training job to write there", path,
                               _waiting_time(self.wait_timeout))
                return
            raise RunNotFound(f"trial path {path} holds no objects. Check the URL (and AWS_ENDPOINT_URL, "
                              "AWS_PROFILE for a non-default endpoint or account); to open a run before its job "
                              "writes anything, pass wait_timeout (seconds to wait for it)")
        if os.path.isdir(path):
            if not _is_run_dir(path) and not os.path.exists(os.path.join(path, END_OF_JOB_FILE)):
                hint = _runs_hint(path)
                if hint:  # a folder of runs, not a run that is about to start
                    raise RunNotFound(f"{path} is not a run directory (no {COLLECTIONS_DIR}/ or {INDEX_DIR}/ in "
                                      f"it){hint}. Open one of them")
                if self.wait_timeout > 0:
                    logger.warning("%s holds no run yet: waiting %s for a training job to write its collections "
                                   "file (wait_timeout)", path, _waiting_time(self.wait_timeout))
            return
        if os.path.exists(path):
            raise RunNotFound(f"trial path {path} is a file, not a run directory")
        if wait_for_directory and self.wait_timeout > 0:
            logger.warning("%s does not exist yet: waiting %s for a training job to create it", path,
                           _waiting_time(self.wait_timeout))
            return
        ancestor = os.path.dirname(path)
        while ancestor and not os.path.isdir(ancestor) and os.path.dirname(ancestor) != ancestor:
            ancestor = os.path.dirname(ancestor)
        hint = _runs_hint(ancestor) if os.path.isdir(ancestor) and ancestor != os.path.dirname(ancestor) else ""
        raise RunNotFound(f"trial path {path} does not exist{hint}. Check the path; to open a run before its "
                          "job creates the directory, pass wait_timeout (seconds to wait for it)")

    def _load_collections(self) -> None:
        """Read the first collections file, then wait (bounded) for every worker's one."""
        deadline = time.monotonic() + self.wait_timeout
        coll_dir = self._storage.local_path(COLLECTIONS_DIR)
        files = self._list_collection_files()
        while not files:
            if self._storage.exists(END_OF_JOB_FILE):
                raise MissingCollectionFiles(
                    f"training has ended ({END_OF_JOB_FILE} exists) but there is no "
                    f"'*{COLLECTIONS_SUFFIX}' file in {coll_dir} ({self._describe_run_directory()})"
                )
            if time.monotonic() >= deadline:
                raise MissingCollectionFiles(
                    f"no '*{COLLECTIONS_SUFFIX}' file appeared in {coll_dir} within "
                    f"{self.wait_timeout:g} s ({self._describe_run_directory()}). Is the path right? "
                    "A running job writes its collections file after its first saved step; "
                    "pass a larger wait_timeout (or set SMDEBUG_TRIAL_WAIT_TIMEOUT) to wait longer"
                )
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))
            files = self._list_collection_files()

        first = f"{COLLECTIONS_DIR}/{files[0]}"
        try:
            data = self._storage.read_file(first, max_bytes=MAX_COLLECTIONS_FILE_BYTES)
            manager, num_workers = CollectionManager.from_json(data, untrusted=True)
        except UnsafeRunFile as exc:
            raise CorruptCollectionsFile(str(exc)) from None
        except (ConfigError, ValueError, RecursionError) as exc:
            raise CorruptCollectionsFile(f"{self._storage.local_path(first)}: {exc}") from None
        except FileNotFoundError:
            raise CorruptCollectionsFile(f"{self._storage.local_path(first)} vanished while being read") from None
        self._collection_manager = manager
        self.num_workers = num_workers

        while len(files) < num_workers:
            if self._storage.exists(END_OF_JOB_FILE):
                logger.warning(
                    "%s: training ended with %d of %d workers' collections files; reading what there is",
                    self.path, len(files), num_workers,
                )
                break
            if time.monotonic() >= deadline:
                raise MissingCollectionFiles(
                    f"{files[0]} says the run has {num_workers} workers, but only {len(files)} "
                    f"collections file(s) ({', '.join(files)}) appeared in {coll_dir} within "
                    f"{self.wait_timeout:g} s; pass a larger wait_timeout to wait longer"
                )
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))
            files = self._list_collection_files()
        self._set_workers(files)

    def _set_workers(self, collection_files: Iterable[str]) -> None:
        self._workers = {_worker_from_name(f[: -len(COLLECTIONS_SUFFIX)]) for f in collection_files}

    def collections(self) -> Dict[str, Collection]:
        """All collections of the run, by name."""
        return self._collection_manager.collections

    def collection(self, name: str) -> Collection:
        """The collection called ``name``. One the run does not have is created empty in this
        trial (as in smdebug 1.0.34), so that regexes can be ``include()``-d into it and it
        can be passed to ``tensor_names(collection=...)``; a debug log names the known ones."""
        coll = self._collection_manager.collections.get(name)
        if coll is None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"a collection name must be a non-empty string, got {name!r}")
            logger.debug("trial %s has no collection %r (known: %s); created empty", self.name, name,
                         ", ".join(sorted(self._collection_manager.collections)) or "none")
            coll = self._collection_manager.get(name)
        return coll

    def _saved_collection(self, name: str) -> Collection:
        """The run's collection called ``name``; KeyError naming the known ones if there is none
        (a typo in ``tensor_names(collection="...")`` must not read as "no tensors")."""
        coll = self._collection_manager.collections.get(name)
        if coll is None:
            known = ", ".join(sorted(self._collection_manager.collections)) or "none"
            raise KeyError(f"no collection named {name!r} in trial {self.name!r}; known: {known}")
        return coll

    # ------------------------------------------------------------------ refreshing
    def _maybe_refresh(self) -> None:
        if self.dynamic_refresh and not self.loaded_all_steps:
            self.refresh()

    def refresh(self, progress: Optional[bool] = None) -> int:
        """Read index files written since the last refresh; returns how many were new.

        Once the end-of-training marker has been seen, all data is known and this
        does nothing.
        """
        if self.loaded_all_steps:
            return 0
        self.stats["refreshes"] += 1
        # Looked at before listing: a writer creates the marker after all its other files,
        # so a listing that starts after we saw the marker sees everything.
        ended = self._storage.exists(END_OF_JOB_FILE)
        new = self._read_new_index_files(self.progress if progress is None else progress)
        if ended:
            if self._training_end_delay > 0:
                time.sleep(self._training_end_delay)
                new += self._read_new_index_files(False)
            self._mark_training_ended()
        else:
            self._apply_incomplete_step_window()
            if len(self._workers) < self.num_workers:
                self._set_workers(self._list_collection_files())
        return new

    def _bucket_in_range(self, bucket: int) -> bool:
        if self.range_steps is None:
            return True
        begin, end = self.range_steps
        lo, hi = bucket * _BUCKET_SPAN, (bucket + 1) * _BUCKET_SPAN  # steps [lo, hi)
        return (begin is None or hi > begin) and (end is None or lo < end)

    def _step_in_range(self, step: int) -> bool:
        if self.range_steps is None:
            return True
        begin, end = self.range_steps
        return (begin is None or step >= begin) and (end is None or step < end)

    def _list_remote_index_files(self) -> Tuple[List[Tuple[str, List[Tuple[int, str, str]]]], int]:
        """New index objects of a remote run, listed by key after the last complete step
        (each worker's uploader publishes its steps in order; incomplete steps, which
        another worker may still fill in, are listed again)."""
        after = None
        if self.last_complete_step >= 0:
            s = self.last_complete_step
            # Step s's names are "<s:012d>_<worker>.json" and "`" is the character after "_": every
            # one of them sorts before this, every later step's after it, whatever the worker names.
            after = f"{INDEX_DIR}/{s // _BUCKET_SPAN:09d}/{s:012d}`"
        by_bucket: Dict[str, List[Tuple[int, str, str]]] = {}
        for bucket, name in self._storage.list_index_files(INDEX_DIR, after):
            if not bucket.isdigit() or not self._bucket_in_range(int(bucket)):
                continue
            seen = self._seen_index_files.setdefault(bucket, set())
            if name in seen or not name.endswith(INDEX_FILE_SUFFIX):
                continue
            try:
                step, worker = parse_step_and_worker(name)
            except ValueError:
                logger.debug("ignoring %s/%s/%s: not an index file name", INDEX_DIR, bucket, name)
                seen.add(name)
                continue
            if not self._step_in_range(step):
                seen.add(name)
                continue
            by_bucket.setdefault(bucket, []).append((step, name, _worker_from_name(worker)))
        todo = [(f"{INDEX_DIR}/{b}", sorted(files, key=lambda item: item[1])) for b, files in sorted(by_bucket.items())]
        return todo, sum(len(files) for _, files in todo)

    def _read_new_index_files(self, progress: Optional[bool]) -> int:
        if getattr(self._storage, "remote", False):
            todo, total = self._list_remote_index_files()
        else:
            todo, total = self._list_local_index_files()
        if not total:
            return 0
        return self._load_index_files(todo, total, progress)

    def _list_local_index_files(self) -> Tuple[List[Tuple[str, List[Tuple[int, str, str]]]], int]:
        now_ns = time.time_ns()
        todo: List[Tuple[str, List[Tuple[int, str, str]]]] = []
        total = 0
        for bucket in sorted(self._storage.list_dir(INDEX_DIR)):
            if not bucket.is_dir or not bucket.name.isdigit():
                continue
            if not self._bucket_in_range(int(bucket.name)):
                continue
            prev = self._bucket_mtime.get(bucket.name)
            if prev == bucket.mtime_ns and now_ns - bucket.mtime_ns > _RESCAN_GRACE_NS:
                continue  # unchanged since we listed it
            # Remember the mtime seen *before* listing: a change after it shows up next time.
            self._bucket_mtime[bucket.name] = bucket.mtime_ns
            seen = self._seen_index_files.setdefault(bucket.name, set())
            rel = f"{INDEX_DIR}/{bucket.name}"
            new_files = []
            for entry in self._storage.list_dir(rel):
                name = entry.name
                if entry.is_dir or name in seen or not name.endswith(INDEX_FILE_SUFFIX):
                    continue
                try:
                    step, worker = parse_step_and_worker(name)
                except ValueError:
                    logger.debug("ignoring %s/%s: not an index file name", rel, name)
                    seen.add(name)
                    continue
                if not self._step_in_range(step):
                    seen.add(name)
                    continue
                new_files.append((step, name, _worker_from_name(worker)))
            if new_files:
                # Lexicographic order = step order: "the first file seen for a step wins".
                new_files.sort(key=lambda item: item[1])
                todo.append((rel, new_files))
                total += len(new_files)
        return todo, total

    def _load_index_files(self, todo, total: int, progress: Optional[bool]) -> int:
        bar = _progress_bar(total >= _PROGRESS_MIN_INDEX_FILES and _progress_wanted(progress), total, "index files")
        new_steps = False
        # Loading creates many small objects and no cycles: the cyclic collector would
        # only rescan the growing state over and over (a third of the load time).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for rel, files in todo:
                seen = self._seen_index_files[rel[len(INDEX_DIR) + 1 :]]
                source_dir = self._storage.local_path(rel)
                try:
                    datas = self._storage.read_small_files(rel, [name for _, name, _ in files],
                                                           max_bytes=MAX_INDEX_FILE_BYTES)
                except (UnsafeRunFile, NotADirectoryError) as exc:
                    # The bucket itself leads outside the run (or loops): none of its steps.
                    seen.update(name for _, name, _ in files)
                    self._skip_corrupt_index(rel, str(exc), steps=len({step for step, _, _ in files}))
                    continue
                for (step, name, worker), data in zip(files, datas):
                    if data is None:
                        continue  # vanished between listing and reading: look again next time
                    seen.add(name)
                    if not isinstance(data, bytes):  # UnsafeRunFile: a FIFO, a link out, too big
                        self._skip_corrupt_index(f"{rel}/{name}", str(data))
                        continue
                    try:
                        parsed = parse_index_json(data, f"{source_dir}/{name}")
                    except IndexReaderException as exc:
                        self._skip_corrupt_index(f"{rel}/{name}", str(exc))
                        continue
                    if self._register_index(step, worker, parsed):
                        new_steps = True
                self.stats["index_files_parsed"] += len(files)
                if bar is not None:
                    bar.update(len(files))
        finally:
            if gc_was_enabled:
                gc.enable()
            if bar is not None:
                bar.close()
            if new_steps:
                self._sorted_steps = None
                self._sorted_mode_steps.clear()
        return total

    def _skip_corrupt_index(self, relpath: str, reason: str, steps: Optional[int] = None) -> None:
        """One bad index file costs its step, not the run: one warning, then it is skipped
        for good (it is listed in ``corrupt_index_files`` and never read again). ``steps``: a
        whole bucket of index files skipped, holding that many steps."""
        self.corrupt_index_files.append(relpath)
        if steps is None:
            logger.warning("smdebug: index file skipped, its step is left out of the trial: %s", reason)
        else:
            logger.warning("smdebug: index directory skipped, its %d steps are left out of the trial: %s", steps,
                           reason)

    def _note_conflict(self, step: int, worker: str, mode: ModeKeys, mode_step: int) -> None:
        """``worker`` saved global ``step`` as another mode step than the worker read first: a
        worker ran steps the others did not (evaluation on one rank only, say). Steps are
        shared by every worker in the format, so the trial keeps the first numbering for
        mode-based reads and this worker's own for its values (one warning per trial)."""
        if not self.worker_step_conflicts:
            first_mode, first_step = self._global_to_mode[step]
            logger.warning(
                "smdebug: workers number global step %d differently in %s: %s saved it as %s step %d, another "
                "worker as %s step %d (a worker ran steps the others did not, e.g. evaluation on one rank only). "
                "Mode steps follow the first worker read; each worker's values keep their own mode and mode step "
                "(to_dataframe, value(step, worker=...) with global steps); trial.worker_step_conflicts lists "
                "every such step. Running the same loops on every worker avoids it.",
                step, self.path, worker, mode.name, mode_step, first_mode.name, first_step)
        self.worker_step_conflicts.setdefault(step, {})[worker] = (mode, mode_step)

    def _register_index(self, step: int, worker: str, parsed) -> bool:
        """Add one parsed index file; returns True if ``step`` was new."""
        mode, mode_step = parsed.mode, parsed.mode_step
        is_new = step not in self._global_to_mode
        if is_new:
            self._global_to_mode[step] = (mode, mode_step)
            if mode is GLOBAL and mode_step != step:
                logger.warning(
                    "%s: step %d is in GLOBAL mode with mode_step %d; GLOBAL-mode data must have "
                    "mode_step == global step (docs/format.md 1.5)", self.path, step, mode_step,
                )
        if not is_new and self._global_to_mode[step] != (mode, mode_step):
            self._note_conflict(step, worker, mode, mode_step)  # not in the trial's mode-step lookups
        elif mode is not GLOBAL:
            self._mode_to_global.setdefault(mode, {}).setdefault(mode_step, step)

        workers = self._workers_for_step.get(step)
        if workers is None:
            workers = self._workers_for_step[step] = set()
        workers.add(worker)
        if len(workers) >= self.num_workers and step > self.last_complete_step:
            self.last_complete_step = step

        tensors = self._tensors
        event_file = parsed.event_file_name
        names = []
        locations = []
        for entry in parsed.tensors:
            name = entry.name
            location = TensorLocation(event_file, entry.start_idx, entry.length, entry.crc32c, name)
            reduction = parse_reduction_tag(name) if REDUCTION_TAG_PREFIX in name else None
            if reduction is not None:
                op, is_abs, name = reduction
            tensor = tensors.get(name)
            if tensor is None:
                tensor = tensors[name] = Tensor(name, self)
            if reduction is None:
                tensor._add_location(step, worker, location)
            else:
                tensor._add_reduction(step, worker, (op, is_abs), location)
            names.append(name)
            locations.append(location)
        self._records.add(step, worker, locations)
        for name, shape in parsed.shapes:
            tensor = tensors.get(name)
            if tensor is None:
                tensor = tensors[name] = Tensor(name, self)
            tensor._add_shape(step, worker, shape)
            names.append(name)
        for name, placement in parsed.placements.items():  # pieces of sharded tensors
            tensor = tensors.get(name)
            if tensor is not None:
                tensor._add_placement(step, worker, placement)

        step_names = self._tensors_for_step.get(step)
        if step_names is None:
            self._tensors_for_step[step] = set(names)
        else:
            step_names.update(names)
        mode_names = self._tensors_for_mode.get(mode)
        if mode_names is None:
            self._tensors_for_mode[mode] = set(names)
        else:
            mode_names.update(names)
        return is_new

    def _mark_training_ended(self) -> None:
        self.loaded_all_steps = True
        if self._global_to_mode:
            self.last_complete_step = max(self.last_complete_step, self._all_steps_sorted()[-1])
        logger.debug("%s: training has ended; %d steps loaded", self.path, len(self._global_to_mode))

    def _apply_incomplete_step_window(self) -> None:
        """Stop waiting for the oldest stragglers once too many steps are incomplete (docs/format.md 5.3).

        While more than the window's number of steps wait, the oldest half-window of them
        is treated as complete. The original compared ``len(steps) - (last_complete_step + 1)``
        with the window, which assumes every step is saved, and moved at most once per
        refresh; this counts the steps actually waiting, so the result does not depend on
        how often the trial was refreshed.
        """
        steps = self._all_steps_sorted()
        first_incomplete = bisect.bisect_right(steps, self.last_complete_step)
        waiting = len(steps) - first_incomplete
        if waiting <= self._incomplete_step_window:
            return
        give_up = max(1, self._incomplete_step_window // 2)
        while waiting > self._incomplete_step_window:
            first_incomplete += give_up
            waiting -= give_up
        self.last_complete_step = steps[first_incomplete - 1]
        logger.info(
            "%s: more than INCOMPLETE_STEP_WAIT_WINDOW=%d steps are incomplete; "
            "treating steps up to %d as complete",
            self.path, self._incomplete_step_window, self.last_complete_step,
        )

    # ------------------------------------------------------------------ steps and modes
    def _all_steps_sorted(self, mode: ModeKeys = GLOBAL) -> List[int]:
        if mode is GLOBAL:
            if self._sorted_steps is None:
                self._sorted_steps = sorted(self._global_to_mode)
            return self._sorted_steps
        cached = self._sorted_mode_steps.get(mode)
        if cached is None:
            cached = self._sorted_mode_steps[mode] = sorted(self._mode_to_global.get(mode, ()))
        return cached

    def _is_complete(self, global_step: int) -> bool:
        return (
            self.loaded_all_steps
            or global_step <= self.last_complete_step
            or len(self._workers_for_step.get(global_step, ())) >= self.num_workers
        )

    def steps(self, mode=GLOBAL, show_incomplete_steps: bool = False) -> List[int]:
        """Sorted saved steps: global steps for GLOBAL, else that mode's own step numbers.

        Only complete steps (every worker wrote them, a later step is complete, or
        training ended) unless ``show_incomplete_steps``.
        """
        mode = ModeKeys.parse(mode)
        self._maybe_refresh()
        steps = self._all_steps_sorted(mode)
        if show_incomplete_steps or self.loaded_all_steps:
            return list(steps)
        if mode is GLOBAL:
            cut = bisect.bisect_right(steps, self.last_complete_step)
            return steps[:cut] + [s for s in steps[cut:] if self._is_complete(s)]
        to_global = self._mode_to_global[mode] if steps else {}
        return [s for s in steps if self._is_complete(to_global[s])]

    def modes(self) -> List[ModeKeys]:
        """The modes (other than GLOBAL) that have saved steps."""
        self._maybe_refresh()
        return sorted(self._mode_to_global, key=lambda m: m.value)

    def _known_global_step(self, mode: ModeKeys, mode_step: int) -> Optional[int]:
        if mode is GLOBAL:
            return mode_step if mode_step in self._global_to_mode else None
        return self._mode_to_global.get(mode, {}).get(mode_step)

    def _step_hint(self, step: int, mode: ModeKeys, tensor=None) -> str:
        """Where ``step`` does exist (another mode, the global numbering) and which steps
        ``mode`` has (of ``tensor`` if given), for error messages."""
        parts = []
        if tensor is not None:
            parts.append(f"steps of {tensor.name!r} in mode {mode.name}: {_steps_text(tensor.steps(mode=mode))}")
        else:
            parts.append(f"saved steps of mode {mode.name}: {_steps_text(self._all_steps_sorted(mode))}")
        elsewhere = []
        for other, by_step in sorted(self._mode_to_global.items(), key=lambda kv: kv[0].value):
            g = by_step.get(step)
            if other is not mode and g is not None and (tensor is None or g in tensor._step_workers):
                elsewhere.append(f"mode {other.name} has a step {step} (global step {g}): pass "
                                 f"mode=smd.modes.{other.name}")
        if mode is not GLOBAL and step in self._global_to_mode and (tensor is None or step in tensor._step_workers):
            m, ms = self._global_to_mode[step]
            elsewhere.append(f"global step {step} is step {ms} of mode {m.name}: pass mode=smd.modes.GLOBAL")
        return "; " + "; ".join(parts + elsewhere)

    def _raise_step_missing(self, step: int, mode: ModeKeys):
        """Raise the exception that says why ``step`` of ``mode`` has no data."""
        state = self._step_state(step, mode)
        if state is StepState.NOT_YET_AVAILABLE:
            raise StepNotYetAvailable(f"step {step} of mode {mode.name} is not available yet in trial {self.name!r}"
                                      + self._step_hint(step, mode))
        steps = self._all_steps_sorted(mode)
        if self.loaded_all_steps and (not steps or step > steps[-1]):
            last = steps[-1] if steps else None
            raise NoMoreData(
                f"training has ended; step {step} of mode {mode.name} was never saved "
                f"(last saved step of that mode: {last})" + self._step_hint(step, mode)
            )
        raise StepUnavailable(f"step {step} of mode {mode.name} was not saved in trial {self.name!r}"
                              + self._step_hint(step, mode))

    def _resolve(self, step, mode) -> Tuple[int, ModeKeys, int]:
        """``(global_step, mode, step)`` for a step given in ``mode``'s numbering.

        For GLOBAL the global step is returned as is, known or not; for other modes an
        unknown mode step triggers a refresh and then the matching exception.
        """
        mode = ModeKeys.parse(mode)
        step = validate_step(step)
        if mode is GLOBAL:
            return step, mode, step
        g = self._known_global_step(mode, step)
        if g is None:
            self._maybe_refresh()
            g = self._known_global_step(mode, step)
            if g is None:
                self._raise_step_missing(step, mode)
        return g, mode, step

    def mode_modestep(self, global_step) -> Tuple[ModeKeys, int]:
        """``(mode, mode_step)`` of a saved global step."""
        g = validate_step(global_step, "global_step")
        hit = self._global_to_mode.get(g)
        if hit is None:
            self._maybe_refresh()
            hit = self._global_to_mode.get(g)
            if hit is None:
                self._raise_step_missing(g, GLOBAL)
        return hit

    def mode(self, global_step) -> ModeKeys:
        """The mode a saved global step belongs to."""
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step) -> int:
        """The mode's own step number of a saved global step."""
        return self.mode_modestep(global_step)[1]

    def global_step(self, mode, mode_step) -> int:
        """The global step of ``mode_step`` of ``mode`` (GLOBAL: the step itself)."""
        mode = ModeKeys.parse(mode)
        step = validate_step(mode_step, "mode_step")
        if mode is GLOBAL:
            return step
        return self._resolve(step, mode)[0]

    def workers(self) -> List[str]:
        """Names of the workers that wrote a collections file."""
        self._maybe_refresh()
        return sorted(self._workers)

    # ------------------------------------------------------------------ completeness
    def _step_state(self, step: int, mode: ModeKeys) -> StepState:
        g = self._known_global_step(mode, step)
        if g is not None:
            return StepState.AVAILABLE if self._is_complete(g) else StepState.NOT_YET_AVAILABLE
        if self.loaded_all_steps:
            return StepState.UNAVAILABLE
        # Absent: skipped if a later step of the mode is complete (a straggler would have
        # written it before), else it may still come.
        steps = self._all_steps_sorted(mode)
        later = bisect.bisect_right(steps, step)
        if later < len(steps):
            next_global = steps[later] if mode is GLOBAL else self._mode_to_global[mode][steps[later]]
            if next_global <= self.last_complete_step:
                return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE

    def has_passed_step(self, step, mode=GLOBAL) -> StepState:
        """AVAILABLE (complete), NOT_YET_AVAILABLE (may still be written) or UNAVAILABLE
        (skipped, or training ended without it)."""
        mode = ModeKeys.parse(mode)
        step = validate_step(step)
        self._maybe_refresh()
        return self._step_state(step, mode)

    def wait_for_steps(self, required_steps, mode=GLOBAL, timeout: Optional[float] = None) -> None:
        """Block until every step in ``required_steps`` is complete.

        Raises StepUnavailable for a skipped step, NoMoreData for a step past the end of a
        finished run, and StepNotYetAvailable when ``timeout`` seconds pass first
        (``timeout=None`` waits until each step is settled one way or the other).
        """
        mode = ModeKeys.parse(mode)
        if isinstance(required_steps, int):
            required_steps = [required_steps]
        steps = [validate_step(s) for s in required_steps]
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        for step in steps:
            while True:
                self._maybe_refresh()
                state = self._step_state(step, mode)
                if state is StepState.AVAILABLE:
                    break
                if state is StepState.UNAVAILABLE:
                    self._raise_step_missing(step, mode)
                if deadline is not None and time.monotonic() >= deadline:
                    raise StepNotYetAvailable(
                        f"step {step} of mode {mode.name} did not become available within {timeout:g} s"
                    )
                pause = self.poll_interval
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                time.sleep(pause)

    def training_ended(self) -> bool:
        """Whether the run's end marker has been seen (all its steps are then loaded)."""
        self._maybe_refresh()
        return self.loaded_all_steps

    def flight_recorder_trigger(self, worker: Optional[str] = None) -> Optional[Dict[str, object]]:
        """What made the run's flight recorder write its steps (docs/flight_recorder.md), or None.

        The marker of ``worker`` (e.g. ``"worker_0"``), else the earliest-stepped of every
        worker's: a dict with ``trigger`` (nonfinite, rule, exception, manual), ``reason``,
        ``global_step``, ``first_nonfinite`` (``module``, ``phase``, ``what``: where the first
        NaN/Inf appeared, when known), ``nonfinite_tensors`` and ``steps_written``. The steps
        it wrote are ordinary steps of the trial.
        """
        markers = self.flight_recorder_triggers()
        if worker is not None:
            return markers.get(worker)
        if not markers:
            return None
        return min(markers.values(), key=lambda m: (m.get("global_step") is None,
                                                     m.get("global_step") if isinstance(m.get("global_step"), int)
                                                     else 0))

    def flight_recorder_triggers(self) -> Dict[str, Dict[str, object]]:
        """Every worker's flight recorder marker, by worker (empty when none fired)."""
        from ...storage.format.layout import MARKER_DIR
        from ...storage.run_files import read_markers

        if not self._storage.is_dir(MARKER_DIR):
            return {}
        return read_markers(lambda: [f"{MARKER_DIR}/{e.name}" for e in self._storage.list_dir(MARKER_DIR)],
                            lambda relpath: self._storage.read_file(relpath, max_bytes=1 << 20))

    # ------------------------------------------------------------------ tensors
    def has_tensor(self, name: str) -> bool:
        """Whether any step saved ``name`` (a value, a reduction or a shape)."""
        if name not in self._tensors:
            self._maybe_refresh()
        return name in self._tensors

    def tensor(self, name: str) -> Tensor:
        """The :class:`Tensor` called ``name``; TensorUnavailable, with close names, if nothing saved it."""
        if not self.has_tensor(name):
            raise TensorUnavailable(f"tensor {name!r} was not saved in trial {self.name!r} (so far)"
                                    + self._name_hint(name))
        return self._tensors[name]

    def _name_hint(self, name) -> str:
        """What the user probably meant by an unknown tensor name."""
        if not isinstance(name, str):
            return f"; tensor names are strings, got {type(name).__name__}"
        known = self._tensors
        if f"scalar/{name}" in known:
            return f"; save_scalar() names are prefixed: use trial.tensor('scalar/{name}')"
        reduction = parse_reduction_tag(name)
        if reduction is not None and reduction[2] in known:
            op, is_abs, base = reduction
            return (f"; reductions belong to their tensor: trial.tensor({base!r}).reduction_value(step, {op!r}"
                    f"{', abs=True' if is_abs else ''})")
        from ...collections import close_matches

        matches = close_matches(name, known)
        if matches:
            return "; did you mean " + " or ".join(map(repr, matches)) + "?"
        total = len(known)
        return f"; it has {total} tensors: trial.tensor_names() lists them" if total else "; it has no tensors yet"

    def _collection_objects(self, collection) -> List[Collection]:
        items = collection if isinstance(collection, (list, tuple, set, frozenset)) else [collection]
        out = []
        for item in items:
            if isinstance(item, Collection):
                out.append(item)
            elif isinstance(item, str):
                out.append(self._saved_collection(item))
            else:
                raise TypeError(f"collection must be a name, a Collection or a list of them, got {item!r}")
        return out

    def tensor_names(
        self,
        collection=None,
        regex=None,
        step=None,
        mode=GLOBAL,
        show_incomplete_steps: bool = False,
    ) -> List[str]:
        """Sorted names of the saved tensors, optionally filtered.

        Args:
            collection: a collection name, Collection, or list of them: keep tensors that
                belong to any of them (their regexes or explicit names).
            regex: a regex or list of regexes (``re.search``): keep tensors matching any.
                With both ``collection`` and ``regex``, a tensor matching either is kept.
            step: only tensors saved at this step (in ``mode``'s numbering).
            mode: restrict to a mode (GLOBAL: all).
            show_incomplete_steps: also count steps not every worker has written yet.

        Reductions (``smdebug/reductions/...``) are not names of their own: they belong
        to their base tensor.
        """
        mode = ModeKeys.parse(mode)
        self._maybe_refresh()
        if step is not None:
            g, mode, step = self._resolve(step, mode)
            if g not in self._global_to_mode:
                self._raise_step_missing(step, mode)
            if not show_incomplete_steps and not self._is_complete(g):
                raise StepNotYetAvailable(
                    f"step {step} of mode {mode.name} is incomplete (not every worker has written it); "
                    "pass show_incomplete_steps=True to list what is there"
                )
            candidates = self._tensors_for_step.get(g, set())
        elif mode is GLOBAL:
            candidates = self._tensors.keys()
        else:
            candidates = self._tensors_for_mode.get(mode, set())
        if step is None and not show_incomplete_steps and not self.loaded_all_steps:
            candidates = [n for n in candidates if self._tensors[n]._has_complete_step()]

        if collection is None and regex is None:
            return sorted(candidates)
        matchers = []
        if collection is not None:
            matchers.extend(c.matches for c in self._collection_objects(collection))
        if regex is not None:
            import re

            regexes = [regex] if isinstance(regex, str) else list(regex)
            for r in regexes:
                if not isinstance(r, str):
                    raise TypeError(f"regex must be a string or a list of strings, got {r!r}")
                try:
                    matchers.append(re.compile(r).search)
                except re.error as exc:
                    raise ValueError(f"invalid regex {r!r}: {exc}") from None
        return sorted(n for n in candidates if any(m(n) for m in matchers))


    # ------------------------------------------------------------------ tables
    def _table_tensors(self, names, regex, collection):
        """The Tensor objects selected by names, regexes and collections (all without any)."""
        self._maybe_refresh()
        if names is None and regex is None and collection is None:
            return [self._tensors[n] for n in sorted(self._tensors)]
        chosen = set()
        if names is not None:
            for name in [names] if isinstance(names, str) else list(names):
                chosen.add(self.tensor(name).name)  # TensorUnavailable, with close names
        if regex is not None or collection is not None:
            chosen.update(self.tensor_names(collection=collection, regex=regex, show_incomplete_steps=True))
        return [self._tensors[n] for n in sorted(chosen)]

    def to_table(self, names=None, *, regex=None, collection=None, mode=None, steps=None, workers=None,
                 show_incomplete_steps: bool = False, progress: Optional[bool] = None,
                 on_error: str = "warn"):
        """Every scalar value and every saved reduction of the selected tensors, in columns,
        without pandas: a :class:`smdebug.analysis.trials.bulk.Table` (see :meth:`to_dataframe`)."""
        from .bulk import collect, read_rows

        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error must be 'warn' or 'raise', got {on_error!r}")
        modes = None
        if mode is not None:
            parsed = {ModeKeys.parse(m) for m in ([mode] if isinstance(mode, (str, int, ModeKeys)) else mode)}
            modes = None if GLOBAL in parsed else parsed
        if steps is not None:
            steps = {validate_step(s) for s in ([steps] if isinstance(steps, numbers.Integral) else steps)}
        if workers is not None:
            workers = {workers} if isinstance(workers, str) else set(workers)
            unknown = workers - self._workers
            if unknown:
                raise ValueError(f"unknown worker(s) {sorted(unknown)} in trial {self.name!r}; "
                                 f"its workers: {sorted(self._workers)}")
        tensors = self._table_tensors(names, regex, collection)
        # Large temporary lists and no cycles: the cyclic collector would only rescan the
        # trial's millions of index objects (as while loading them).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            rows = collect(self, tensors, modes, steps, workers, show_incomplete_steps)
            return read_rows(self, rows, progress, on_error)
        finally:
            if gc_was_enabled:
                gc.enable()

    def to_dataframe(self, names=None, *, regex=None, collection=None, mode=None, steps=None, workers=None,
                     show_incomplete_steps: bool = False, progress: Optional[bool] = None,
                     on_error: str = "warn"):
        """The run's scalars and saved reductions as a long pandas DataFrame.

        One row per value, columns ``step`` (global step), ``mode`` (``"TRAIN"``...),
        ``mode_step``, ``worker``, ``tensor``, ``reduction`` (``""`` for a scalar's own
        value, else ``min``, ``l2``, ``abs_max``...) and ``value`` (float64); texts are
        categoricals. Rows are sorted by tensor, reduction, worker and step.
        ``df.pivot_table(index="step", columns="tensor", values="value")`` gives wide form.

        Args:
            names: a tensor name or a list of them.
            regex: a regex or list of regexes (``re.search``) on tensor names.
            collection: a collection name, Collection, or list of them.
              Without ``names``, ``regex`` and ``collection``: every tensor. With several,
              a tensor selected by any of them is in.
            mode: a mode or list of modes (None or GLOBAL: all).
            steps: a step or an iterable of steps: the modes' own step numbers when
              ``mode`` is given, else global steps.
            workers: a worker name or a list of them (default: all).
            show_incomplete_steps: also steps not every worker has written yet.
            progress: a progress bar over the event files (default: on a terminal, for
              long reads).
            on_error: ``"warn"`` (default): a value that cannot be read (a damaged
              record, a missing event file) is left out, with one warning for all of
              them; ``"raise"``: the first such error is raised.

        A tensor's raw value is a row only when it holds one real number (bool, int or
        float; complex, string and larger tensors are left out); reductions computed on
        the fly by ``reduction_value`` are not included, only saved ones. Each row equals
        ``float(tensor.value(step, mode, worker))`` or ``reduction_value(...)``. Event files
        are read once each and their records decoded together (smdebug.analysis.trials.bulk).
        Needs pandas (``pip install 'smdebug-core[analysis]'``); :meth:`to_table` does not.
        """
        from .bulk import require_pandas

        require_pandas("Trial.to_dataframe")
        return self.to_table(names, regex=regex, collection=collection, mode=mode, steps=steps, workers=workers,
                             show_incomplete_steps=show_incomplete_steps, progress=progress,
                             on_error=on_error).to_pandas()

    # ------------------------------------------------------------------ notebooks
    def summary(self) -> Dict[str, object]:
        """What the run holds, for people: path, state, workers, modes with their step
        ranges, collections used, and tensor counts."""
        self._maybe_refresh()
        modes = {}
        for mode in self.modes():
            steps = self._all_steps_sorted(mode)
            modes[mode.name] = (len(steps), steps[0], steps[-1]) if steps else (0, None, None)
        if GLOBAL in {m for m, _ in self._global_to_mode.values()}:
            steps = sorted(g for g, (m, _) in self._global_to_mode.items() if m is GLOBAL)
            modes["GLOBAL"] = (len(steps), steps[0], steps[-1])
        names = list(self._tensors)[:2000]  # enough to name the collections in use
        used = []
        for cname, coll in sorted(self.collections().items()):
            try:
                if any(coll.matches(n) for n in names):
                    used.append(cname)
            except CorruptCollectionsFile:  # a regex refused for safety: listed as unknown
                used.append(f"{cname} (regex refused)")
        return {"name": self.name, "path": self.path, "ended": self.loaded_all_steps,
                "workers": sorted(self._workers), "steps": len(self._global_to_mode), "modes": modes,
                "tensors": len(self._tensors), "collections": used}

    def _repr_html_(self) -> str:
        """A table of the run for Jupyter."""
        import html

        info = self.summary()
        rows = [("path", info["path"]), ("state", "ended" if info["ended"] else "training (or not ended)"),
                ("workers", ", ".join(info["workers"]) or "none"), ("saved steps", str(info["steps"])),
                ("tensors", str(info["tensors"])), ("collections", ", ".join(info["collections"]) or "none")]
        for mode, (count, first, last) in info["modes"].items():
            rows.append((f"{mode} steps", f"{count} ({first} to {last})" if count else "0"))
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(v)}</td></tr>" for k, v in rows)
        return f"<div><strong>smdebug Trial {html.escape(info['name'])}</strong><table>{body}</table></div>"


def create_trial(
    path=None,
    name: Optional[str] = None,
    range_steps=None,
    check: Union[bool, str] = False,
    index_mode: bool = True,
    cache: bool = False,
    *,
    out_dir=None,
    wait_timeout: Optional[float] = None,
    progress: Optional[bool] = None,
    max_expanded_elements: Optional[int] = None,
) -> Trial:
    """Open the run written to ``path`` (or ``out_dir=``, its alias) for reading.

    Args:
        path: the run directory; ``~`` is expanded and surrounding whitespace stripped.
            A URL opens a run on an object store: ``s3://bucket/prefix`` (with the
            ``s3`` extra; endpoint, region and credentials from the AWS environment:
            ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...) or any fsspec URL (``memory://``,
            ``gs://``...); ``file://`` is a local path.
        name: a name for the trial (default: the directory's last component).
        range_steps: ``(begin, end)``: only load global steps ``begin <= step < end``
            (either may be None).
        check: record checks when reading values: False/"minimal" (length CRC; payloads
            are verified against the index's CRC32C when it has one), True/"full" (also
            a real payload CRC footer when present), "none".
        index_mode: must be True (index files are mandatory).
        cache: keep values in memory once read.
        wait_timeout: seconds to wait for the collections files of a run that is still
            starting (default: $SMDEBUG_TRIAL_WAIT_TIMEOUT or 30; ``math.inf`` waits
            as long as it takes). MissingCollectionFiles is raised when it runs out.
            A path that does not exist fails at once (RunNotFound, naming the runs found
            near it) unless ``wait_timeout`` is given: then the directory is waited for
            too. A folder that holds runs in subdirectories, rather than being one, fails
            at once and lists them.
        progress: show progress bars for long loads and reads (default: when stderr is a
            terminal).
        max_expanded_elements: the most elements a record may expand to when it holds
            fewer values than its shape (TensorFlow's repeat-the-last-value rule);
            CorruptRecord beyond (default: $SMDEBUG_MAX_EXPANDED_ELEMENTS or 2**24).
    """
    if path is not None and out_dir is not None and path != out_dir:
        raise ValueError(f"give the run directory once: path={path!r} and out_dir={out_dir!r} differ")
    path = path if path is not None else out_dir
    if path is None:
        raise ValueError("create_trial needs the run directory: create_trial('/path/to/run')")
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"the trial path must be a string or os.PathLike, got {path!r}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    path = path.strip()
    if not path:
        raise ValueError("the trial path is empty")
    return Trial(
        path,
        name=name,
        range_steps=range_steps,
        check=check,
        index_mode=index_mode,
        cache=cache,
        wait_timeout=wait_timeout,
        progress=progress,
        # Asking to wait is the way to open a run before its job has created the directory.
        wait_for_directory=wait_timeout is not None,
        max_expanded_elements=max_expanded_elements,
    )


class LocalTrial(Trial):
    """A trial of a local run directory, constructed as in smdebug 1.0.34:
    ``LocalTrial(name, dirname)``. ``parallel`` is accepted and has no effect (reads are
    not threaded here). Prefer :func:`create_trial`."""

    def __init__(self, name, dirname, range_steps=None, parallel=True, check=False, index_mode=True,
                 cache=False, **kwargs):
        super().__init__(os.path.expanduser(os.fspath(dirname)), name=name, range_steps=range_steps, check=check,
                         index_mode=index_mode, cache=cache, **kwargs)

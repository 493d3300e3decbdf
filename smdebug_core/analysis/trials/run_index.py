"""What a run's index files say, read incrementally (docs/format.md 1.2, section 5).

Each refresh lists the index buckets whose directory changed (on object stores: the keys
after the last complete step) and parses only the files not read before. Every index file
read is registered: its step (:class:`StepIndex`), each tensor's records
(:class:`TensorRecords`), the same records in columns for bulk reads (:class:`RecordLog`),
and the names each step and mode saved.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from ...exceptions import IndexReaderException, UnsafeRunFile
from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag
from ...storage.format.index import parse_index_json
from ...storage.format.layout import INDEX_DIR, INDEX_FILE_SUFFIX, MAX_INDEX_FILE_BYTES, parse_step_and_worker
from .locations import TensorLocation, TensorRecords
from .paths import worker_from_name
from .progress import progress_bar, progress_wanted
from .record_log import RecordLog
from .steps import StepIndex

logger = logging.getLogger("smdebug.trials")

#: Index buckets hold the files of 1000 consecutive steps (docs/format.md 1.2).
_BUCKET_SPAN = 1000
#: A bucket whose directory changed less than this long ago is listed again even if its
#: mtime did not move: directory mtimes are coarse, a file renamed into the bucket in the
#: same clock tick as our last listing would otherwise be missed.
_RESCAN_GRACE_NS = 2_000_000_000
#: Show a progress bar for loads bigger than this.
_PROGRESS_MIN_INDEX_FILES = 5000


#: Entry names remembered while loading (a run with more distinct names parses the rest again).
_MAX_CACHED_TAGS = 1 << 20


class RunIndex:
    """The index files of one run read so far, and what they say.

    ``range_steps``: ``(begin, end)`` or None, the global steps to load. ``stats``: the
    trial's counters (``index_files_parsed``).
    """

    def __init__(self, storage, range_steps, stats: Dict[str, int]):
        self.storage = storage
        self.range_steps = range_steps
        self.stats = stats
        self.steps = StepIndex()
        self.tensors: Dict[str, TensorRecords] = {}
        # index entry name -> (its tensor's records, reduction key or None, tensor name)
        self._by_tag: Dict[str, tuple] = {}
        self.log = RecordLog()  # the same entries in columns, for bulk reads
        self.tensors_for_step: Dict[int, Set[str]] = {}
        self.tensors_for_mode: Dict[ModeKeys, Set[str]] = {}
        # Incremental listing: files already read and the mtime seen, per index bucket.
        self._seen_index_files: Dict[str, Set[str]] = {}
        self._bucket_mtime: Dict[str, int] = {}
        self.corrupt_index_files: List[str] = []

    def read_new(self, progress: Optional[bool]) -> int:
        """Read the index files written since the last call; returns how many were new.
        ``progress``: a progress bar for long loads (None: on a terminal)."""
        if getattr(self.storage, "remote", False):
            todo, total = self._list_remote_index_files()
        else:
            todo, total = self._list_local_index_files()
        if not total:
            return 0
        return self._load_index_files(todo, total, progress)

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
        if self.steps.last_complete_step >= 0:
            s = self.steps.last_complete_step
            # Step s's names are "<s:012d>_<worker>.json" and "`" is the character after "_": every
            # one of them sorts before this, every later step's after it, whatever the worker names.
            after = f"{INDEX_DIR}/{s // _BUCKET_SPAN:09d}/{s:012d}`"
        by_bucket: Dict[str, List[Tuple[int, str, str]]] = {}
        for bucket, name in self.storage.list_index_files(INDEX_DIR, after):
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
            by_bucket.setdefault(bucket, []).append((step, name, worker_from_name(worker)))
        todo = [(f"{INDEX_DIR}/{b}", sorted(files, key=lambda item: item[1])) for b, files in sorted(by_bucket.items())]
        return todo, sum(len(files) for _, files in todo)

    def _list_local_index_files(self) -> Tuple[List[Tuple[str, List[Tuple[int, str, str]]]], int]:
        now_ns = time.time_ns()
        todo: List[Tuple[str, List[Tuple[int, str, str]]]] = []
        total = 0
        for bucket in sorted(self.storage.list_dir(INDEX_DIR)):
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
            for entry in self.storage.list_dir(rel):
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
                new_files.append((step, name, worker_from_name(worker)))
            if new_files:
                # Lexicographic order = step order: "the first file seen for a step wins".
                new_files.sort(key=lambda item: item[1])
                todo.append((rel, new_files))
                total += len(new_files)
        return todo, total

    def _load_index_files(self, todo, total: int, progress: Optional[bool]) -> int:
        bar = progress_bar(total >= _PROGRESS_MIN_INDEX_FILES and progress_wanted(progress), total, "index files")
        new_steps = False
        # Loading creates many small objects and no cycles: the cyclic collector would
        # only rescan the growing state over and over (a third of the load time).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for rel, files in todo:
                seen = self._seen_index_files[rel[len(INDEX_DIR) + 1 :]]
                source_dir = self.storage.local_path(rel)
                try:
                    datas = self.storage.read_small_files(rel, [name for _, name, _ in files],
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
                self.steps.forget_sorted()
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

    def _register_index(self, step: int, worker: str, parsed) -> bool:
        """Add one parsed index file; returns True if ``step`` was new."""
        mode = parsed.mode
        is_new = self.steps.add(step, worker, mode, parsed.mode_step, self.storage.root)

        tensors = self.tensors
        by_tag = self._by_tag
        if len(by_tag) > _MAX_CACHED_TAGS:
            by_tag.clear()
        event_file = parsed.event_file_name
        names = []
        locations = []
        for entry in parsed.tensors:
            tag = entry.name
            location = TensorLocation(event_file, entry.start_idx, entry.length, entry.crc32c, tag)
            known = by_tag.get(tag)  # a run repeats its tags at every step: each is parsed once
            if known is None:
                reduction = parse_reduction_tag(tag) if REDUCTION_TAG_PREFIX in tag else None
                name = tag if reduction is None else reduction[2]
                records = tensors.get(name)
                if records is None:
                    records = tensors[name] = TensorRecords()
                known = by_tag[tag] = (records, None if reduction is None else reduction[:2], name)
            records, key, name = known
            if key is None:
                records.add_value(step, worker, location)
            else:
                records.add_reduction(step, worker, key, location)
            names.append(name)
            locations.append(location)
        self.log.add(step, worker, locations)
        for name, shape in parsed.shapes:
            records = tensors.get(name)
            if records is None:
                records = tensors[name] = TensorRecords()
            records.add_shape(step, worker, shape)
            names.append(name)
        for name, placement in parsed.placements.items():  # pieces of sharded tensors
            records = tensors.get(name)
            if records is not None:
                records.add_placement(step, worker, placement)

        step_names = self.tensors_for_step.get(step)
        if step_names is None:
            self.tensors_for_step[step] = set(names)
        else:
            step_names.update(names)
        mode_names = self.tensors_for_mode.get(mode)
        if mode_names is None:
            self.tensors_for_mode[mode] = set(names)
        else:
            mode_names.update(names)
        return is_new

    def shape_steps(self) -> Dict[str, np.ndarray]:
        """``name -> global steps`` of the saved shapes."""
        return {n: np.asarray(sorted(r.shapes), np.int64) for n, r in self.tensors.items() if r.shapes}

    def names_with_complete_step(self, candidates, is_complete) -> List[str]:
        """The names among ``candidates`` with a step that ``is_complete`` (by global step)."""
        return [n for n in candidates if self.tensors[n].has_complete_step(is_complete)]

    def table(self, names, modes, steps, workers, include_incomplete: bool, labels, reader, on_error: str,
              progress: Optional[bool]):
        """``Trial.to_table``'s rows: the records selected (bulk.collect), read in bulk (bulk.read_rows)."""
        from .bulk import collect, read_rows

        rows = collect(self.log, self.steps, names, modes, steps, workers, include_incomplete, labels)
        return read_rows(rows, reader, self.steps, self.stats, progress, on_error)


"""Uploads a run from its local spool directory to a URL (``s3://...``, any fsspec URL).

A hook whose ``out_dir`` is a URL writes the run into a spool directory exactly as it
writes a local run (atomic renames, docs/format.md 1.3). The :class:`RunWriter` tells the
:class:`Uploader` each file it has published there; the uploader's thread sends them to
the URL under the same relative keys, so the objects have the local layout and smdebug
1.0.34's S3 trial reads them:

* the collections file first, then per step the event object and after it the index
  object, the end marker (``training_job_end.ts``) last of all (docs/format.md 1.4);
* event objects go up concurrently (``concurrency`` at a time); index objects one at a
  time, in step order, each after its event object: a reader that lists the keys after
  the last step it has seen (trials/trial.py) never misses one;
* each object is written once with one PUT of its whole content (or s3fs's multipart
  upload for large ones), never appended to or re-uploaded; its spool copy is deleted once
  uploaded, so the spool holds only what is not yet up, except that a step's event file
  is deleted only once its index object is up too: a step an outage interrupts stays whole
  in the spool, and ``smdebug-sync`` sends it again whole (docs/faults.md). The collections
  file is the one exception: the hook rewrites it at close with the final collections, and
  it is sent again only if its bytes changed;
* a failed upload is retried with exponential backoff, the files waiting in the spool,
  for as long as ``retry_budget_s`` of consecutive failures; an outage shorter than that
  costs nothing. Past it the uploader gives up with one warning that names the spool and
  the command that finishes the upload (``smdebug-sync SPOOL URL``). ``close()`` waits
  at most ``$SMDEBUG_UPLOAD_CLOSE_TIMEOUT`` (60 s), says after a few seconds what for,
  and past it leaves the rest in the spool with the same warning;
* the training thread never waits for the network: :meth:`notify` only appends to a
  list. The spool's disk use is bounded: while more than ``max_spool_bytes`` wait, the
  writer is told to skip new steps (``spool_full``), with one warning.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..environment import env_nonnegative_float
from .format import layout, store

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 8
#: Seconds of consecutive upload failures after which the uploader gives up (the files stay
#: in the spool for ``smdebug-sync``).
DEFAULT_RETRY_BUDGET_S = 900.0
DEFAULT_MAX_SPOOL_BYTES = 8 << 30
#: How long ``close()`` waits for the upload by default (seconds): a training job's end should
#: not wait longer on a dead store; what is left stays in the spool for ``smdebug-sync``.
DEFAULT_CLOSE_TIMEOUT_S = 60.0
#: After this many seconds of waiting, ``close()`` says what it waits for.
CLOSE_NOTICE_S = 2.0
#: Files the hook writes into out_dir itself (not through the writer): uploaded at close.
SIDE_FILES = ("training_stop_reason.json", "early_stopping.json")
#: Files of a spool that are never uploaded: stop requests are read by the hook from its spool.
_NEVER_UPLOADED = ("smdebug_stop_request.json",)
#: Where each worker of a multi-node run says that its upload is complete.
WORKERS_DONE_DIR = ".smdebug_workers"
_BACKOFF_FIRST_S = 0.2
_BACKOFF_MAX_S = 20.0

RETRY_BUDGET_ENV = "SMDEBUG_UPLOAD_RETRY_BUDGET"
CLOSE_TIMEOUT_ENV = "SMDEBUG_UPLOAD_CLOSE_TIMEOUT"
MAX_SPOOL_ENV = "SMDEBUG_SPOOL_MAX_BYTES"
CONCURRENCY_ENV = "SMDEBUG_UPLOAD_CONCURRENCY"
#: Set to 1 to upload from a thread of the training process instead of a process of its own.
IN_PROCESS_ENV = "SMDEBUG_UPLOAD_IN_PROCESS"


def sync_command(spool: str, url: str) -> str:
    return f"smdebug-sync {spool} {url}"


def spool_limit(max_spool_bytes: Optional[int] = None) -> int:
    """Bytes the spool may hold not yet uploaded: the argument, else ``$SMDEBUG_SPOOL_MAX_BYTES`` or 8 GiB."""
    return int(env_nonnegative_float(MAX_SPOOL_ENV, DEFAULT_MAX_SPOOL_BYTES)
               if max_spool_bytes is None else max_spool_bytes)


def warn_spool_full(uploader) -> None:
    logger.warning("smdebug: the spool %s holds %d MiB not yet uploaded to %s (limit %d MiB, %s); new steps are "
                   "skipped until the upload catches up", uploader.spool, uploader.pending_bytes >> 20,
                   uploader.url, uploader.max_spool_bytes >> 20, MAX_SPOOL_ENV)


def warn_left_behind(reason: str, spool: str, url: str) -> None:
    logger.warning("smdebug: %s. The rest of the run is in the spool %s; finish the upload with: %s",
                   reason, spool, sync_command(spool, url))


class _GaveUp(Exception):
    pass


class SpoolAccount:
    """What the writer asks an uploader, answered from a count of the files notified and not
    yet uploaded (shared by :class:`Uploader` and ``upload_process.UploaderProcess``). The
    owner calls :meth:`_init_account` first."""

    #: Whether close() says, after a few seconds, what it waits for (not for smdebug-sync's own close).
    announce_close_wait = True

    def _init_account(self, spool: str, url: str, max_spool_bytes: Optional[int]):
        """Set up the account; returns ``(filesystem, root)`` for ``url`` (a bad URL or a
        missing extra fails here, named)."""
        from . import remote

        self.spool = os.path.abspath(spool)
        self.url = remote.normalize_url(url)
        self.max_spool_bytes = spool_limit(max_spool_bytes)
        self._cond = threading.Condition()
        self._backlog_bytes = 0  # published in the spool, not uploaded yet
        self._outstanding = 0  # files notified and not uploaded yet
        self._end_held = False  # the end marker was notified: it waits for close
        self._gave_up: Optional[str] = None
        self._warned_full = False
        self._last_progress = time.monotonic()  # when a file was last uploaded (or the account opened)
        return remote.filesystem(self.url, for_writing=True)

    def spool_full(self) -> bool:
        """Whether the spool holds more than ``max_spool_bytes`` not yet uploaded (the writer then skips steps)."""
        full = self._backlog_bytes > self.max_spool_bytes
        if full and not self._warned_full:
            self._warned_full = True
            warn_spool_full(self)
        return full

    @property
    def gave_up(self) -> Optional[str]:
        """Why the uploader stopped (the files are left in the spool), or None."""
        return self._gave_up

    @property
    def pending_bytes(self) -> int:
        return self._backlog_bytes

    def _say_what_close_waits_for(self, timeout: float, failing: bool) -> None:
        """One line, a few seconds into a close that has not finished: what is left, where it
        goes and how long close() waits. A warning while the store fails or nothing went up
        for a while (a store that does not answer fails no request yet); else info (a slow
        store, a large backlog)."""
        failing = failing or time.monotonic() - self._last_progress >= CLOSE_NOTICE_S
        logger.log(logging.WARNING if failing else logging.INFO,
                   "smdebug: close() is waiting for %d file(s) (%.1f MiB) of the spool %s to reach %s%s; it waits "
                   "up to %g s in all (%s), then leaves them in the spool for: %s", self._outstanding,
                   self._backlog_bytes / 2**20, self.spool, self.url, ", which is not taking them" if failing else "",
                   timeout, CLOSE_TIMEOUT_ENV, sync_command(self.spool, self.url))

    def _wait_for_close(self, finished: Callable[[float], bool], timeout: float, failing: Callable[[], bool],
                        grace: float = 0.0) -> bool:
        """Wait up to ``timeout + grace`` seconds for ``finished(seconds)`` (which waits that
        long at most and says whether the close is done), announcing what is left after
        ``CLOSE_NOTICE_S`` when the close takes longer: the one close-wait of both uploaders."""
        started = time.monotonic()
        if finished(min(timeout, CLOSE_NOTICE_S)):
            return True
        if timeout > CLOSE_NOTICE_S and self.announce_close_wait:
            self._say_what_close_waits_for(timeout, failing=failing())
        return finished(max(0.0, timeout + grace - (time.monotonic() - started)))

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until every file notified so far is uploaded (not for the end marker, which
        is held for close). False on timeout or when the uploader has given up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._gave_up is None and self._outstanding > (1 if self._end_held else 0):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 1.0)
            return self._gave_up is None


class Uploader(SpoolAccount):
    """Sends the files published in ``spool`` to ``url`` (see the module docstring).

    ``extra_dirs``: ``(local directory, URL)`` pairs uploaded whole at :meth:`close`, before
    the end marker (TensorBoard files, which their writer appends to until it closes them).

    Multi-node runs (several workers, one prefix): with ``worker`` given, the uploader puts
    ``.smdebug_workers/<worker>.done`` once all its files are up; the chief, given its
    job's other workers in ``wait_for_workers``, uploads the end marker only after their
    ``.done`` objects appear (at most until its close timeout), so a reader that sees the
    marker sees every worker's steps. Readers ignore that folder (1.0.34 too).
    """

    def __init__(self, spool: str, url: str, *, concurrency: Optional[int] = None,
                 retry_budget_s: Optional[float] = None, max_spool_bytes: Optional[int] = None,
                 extra_dirs: Sequence[Tuple[str, str]] = (), worker: Optional[str] = None,
                 wait_for_workers: Sequence[str] = ()):
        self._fs, self._root = self._init_account(spool, url, max_spool_bytes)
        self.concurrency = int(concurrency or env_nonnegative_float(CONCURRENCY_ENV, DEFAULT_CONCURRENCY)) or 1
        self.retry_budget_s = (env_nonnegative_float(RETRY_BUDGET_ENV, DEFAULT_RETRY_BUDGET_S)
                               if retry_budget_s is None else float(retry_budget_s))
        self.extra_dirs = list(extra_dirs)
        self.worker = worker
        self.wait_for_workers = list(wait_for_workers)
        #: Counters for tests and benchmarks: objects and bytes sent, PUT attempts, failures,
        #: bytes the writer published, bytes of a collections file the hook rewrote that were not sent again.
        self.stats: Dict[str, int] = {"objects": 0, "bytes": 0, "put_requests": 0, "failed_attempts": 0,
                                      "bytes_published": 0, "bytes_not_resent": 0}
        self._incoming: List[Tuple[str, int]] = []
        self._sent: set = set()  # relpaths uploaded (never sent twice, see _upload_batch)
        self._closing = False
        self._done = False
        self._warned_outage = False
        self._warned_left = False
        self._uploaded_hashes: Dict[str, str] = {}  # relpath -> sha1 of the bytes sent (collections)
        # (step, worker) -> relpath of an event file uploaded and kept in the spool until its index is up
        self._uploaded_events: Dict[Tuple[int, str], str] = {}
        self._failing_since: Optional[float] = None
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="smdebug-upload")
        self._thread = threading.Thread(target=self._run, name="smdebug-uploader", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ writer-thread API
    def notify(self, relpath: str, nbytes: int = 0) -> None:
        """``relpath`` has been published (renamed into place) in the spool. Never blocks on the network."""
        with self._cond:
            self._incoming.append((relpath, nbytes))
            self._outstanding += 1
            self._backlog_bytes += nbytes
            self.stats["bytes_published"] += nbytes
            self._cond.notify_all()

    def close(self, timeout: Optional[float] = None) -> bool:
        """Upload what is left (extra directories, then the end marker) and stop.

        Waits up to ``timeout`` seconds (default ``$SMDEBUG_UPLOAD_CLOSE_TIMEOUT`` or 60),
        saying after a few seconds what it waits for. Returns True when everything is
        uploaded; otherwise logs one warning that names the spool and the command that
        finishes the upload, and leaves the files there.
        """
        if timeout is None:
            timeout = env_nonnegative_float(CLOSE_TIMEOUT_ENV, DEFAULT_CLOSE_TIMEOUT_S)
        started = time.monotonic()
        with self._cond:
            self._closing = True
            self._cond.notify_all()

        def thread_done(seconds: float) -> bool:
            self._thread.join(seconds)
            return not self._thread.is_alive()

        finished = self._wait_for_close(thread_done, timeout, lambda: self._failing_since is not None)
        if not finished:
            with self._cond:
                if self._gave_up is None:
                    self._gave_up = f"the upload did not finish within close()'s {timeout:g} s"
                    self._cond.notify_all()
            self._warn_left_behind()
        elif self._gave_up is None:
            logger.info("smdebug: run uploaded to %s in %.1f s after close (%d objects, %d bytes)", self.url,
                        time.monotonic() - started, self.stats["objects"], self.stats["bytes"])
            self._remove_spool()
        self._pool.shutdown(wait=False)
        return finished and self._gave_up is None

    # ------------------------------------------------------------ uploader thread
    def _key(self, relpath: str, root: Optional[str] = None) -> str:
        root = self._root if root is None else root
        return f"{root}/{relpath}" if root else relpath

    def _put_once(self, local_path: str, key: str) -> int:
        with open(local_path, "rb") as fh:
            data = fh.read()
        with self._cond:  # pool threads count too
            self.stats["put_requests"] += 1
        self._fs.pipe_file(key, data)
        return len(data)

    def _retrying(self, attempt: Callable[[], object], key: str, final: tuple = ()):
        """``attempt()``'s result, retried with backoff while the store fails, until it succeeds
        or the retry budget is spent (:class:`_GaveUp`); exceptions in ``final`` are not retried."""
        backoff = _BACKOFF_FIRST_S
        while True:
            if self._gave_up is not None:
                raise _GaveUp(self._gave_up)
            try:
                result = attempt()
            except final:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the store is retried
                self._note_failure(key, exc)
                with self._cond:
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            with self._cond:
                if self._failing_since is not None:  # the store is back: the other retries go now
                    logger.info("smdebug: uploads to %s go through again after %.0f s", self.url,
                                time.monotonic() - self._failing_since)
                    self._cond.notify_all()
                self._failing_since = None
            return result

    def _put(self, relpath: str, local_path: Optional[str] = None, key: Optional[str] = None,
             delete: bool = True) -> None:
        """Upload one file, retrying with backoff until it succeeds or the retry budget is spent."""
        local_path = local_path or os.path.join(self.spool, relpath)
        key = key or self._key(relpath)

        def attempt() -> Optional[int]:
            try:
                return self._put_once(local_path, key)
            except FileNotFoundError:
                if not os.path.exists(local_path):
                    return None  # nothing to retry
                raise

        size = self._retrying(attempt, key)
        if size is None:
            logger.warning("smdebug: %s vanished from the spool before its upload", local_path)
            return
        with self._cond:
            self.stats["objects"] += 1
            self.stats["bytes"] += size
        if delete:
            self._remove_from_spool(local_path)

    def _remove_from_spool(self, path: str) -> None:
        try:
            os.remove(os.path.join(self.spool, path))  # a relpath, or an absolute path
        except OSError:
            pass

    def _note_failure(self, key: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._cond:
            self.stats["failed_attempts"] += 1
            if self._failing_since is None:
                self._failing_since = now
            failing_for = now - self._failing_since
            first = not self._warned_outage
            self._warned_outage = True
            if failing_for >= self.retry_budget_s and self._gave_up is None:
                self._gave_up = (f"uploads to {self.url} failed for {failing_for:.0f} s (the retry budget, "
                                 f"{RETRY_BUDGET_ENV}={self.retry_budget_s:g}); last error: "
                                 f"{type(exc).__name__}: {exc}")
                self._cond.notify_all()
                return
        if first:
            logger.warning("smdebug: uploading %s failed (%s: %s); retrying with backoff for up to %g s, "
                           "training goes on and its steps wait in the spool %s", key, type(exc).__name__, exc,
                           self.retry_budget_s, self.spool)

    def _put_bytes(self, relpath: str, data: bytes) -> None:
        """A small object made here (not from the spool), with the same retries."""
        path = os.path.join(self.spool, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        self._put(relpath)

    def _wait_for_workers(self) -> None:
        """Until every worker in ``wait_for_workers`` has put its ``.done`` object (bounded by
        close()'s timeout: close gives up, and says so, if a worker never finishes)."""
        waiting = list(self.wait_for_workers)
        warned = False
        pause = 0.1
        while waiting and self._gave_up is None:
            try:
                waiting = [w for w in waiting if not self._fs.exists(self._key(f"{WORKERS_DONE_DIR}/{w}.done"))]
            except Exception:  # noqa: BLE001 - an outage: look again
                pass
            if not waiting:
                return
            if not warned and pause >= 2:
                warned = True
                logger.info("smdebug: waiting for workers %s to finish their upload to %s before the end marker",
                            ", ".join(waiting), self.url)
            with self._cond:
                self._cond.wait(pause)
            pause = min(pause * 2, 5.0)
        if self._gave_up is not None:
            raise _GaveUp(self._gave_up)

    def _remove_spool(self) -> None:
        """Everything is on the store: remove the spool (empty directories and its manifest),
        unless a file is still there (written after close: then it is kept, and said so)."""
        left = spool_files(self.spool)
        if left:
            logger.warning("smdebug: %d file(s) appeared in the spool %s after its upload (first: %s); they are "
                           "kept there: %s", len(left), self.spool, left[0][0], sync_command(self.spool, self.url))
            return
        shutil.rmtree(self.spool, ignore_errors=True)

    def _warn_left_behind(self) -> None:
        with self._cond:
            if self._warned_left:
                return
            self._warned_left = True
        warn_left_behind(self._gave_up, self.spool, self.url)

    def _take(self) -> Tuple[List[Tuple[str, int]], bool]:
        with self._cond:
            while not self._incoming and not self._closing and self._gave_up is None:
                self._cond.wait()
            items, self._incoming = self._incoming, []
            return items, self._closing and not self._incoming

    def _check_prefix(self) -> None:
        """Before the first upload, the check for an earlier run in the prefix that the hook
        could not make (the store was down then): retried like an upload; a prefix holding
        another run receives nothing (the spool keeps this run, and the warning says how to
        send it elsewhere)."""
        from . import remote
        from ..exceptions import OutDirError

        try:
            pending = remote.read_manifest(self.spool).get(remote.UNCHECKED_KEY)
        except (OSError, ValueError):
            return
        if not isinstance(pending, dict):
            return
        try:
            self._retrying(lambda: remote.check_remote_out_dir(
                self.url, str(pending.get("worker")), bool(pending.get("overwrite")), pending.get("siblings") or ()),
                self.url, final=(OutDirError,))
        except OutDirError as exc:
            with self._cond:
                self._gave_up = f"nothing was uploaded: {exc}"
                self._cond.notify_all()
            raise _GaveUp(self._gave_up) from None
        remote.set_manifest(self.spool, **{remote.UNCHECKED_KEY: None})

    def _run(self) -> None:
        end_marker: Optional[int] = None
        try:
            self._check_prefix()
            while True:
                items, closing = self._take()
                if self._gave_up is not None:
                    break
                end_seen = [n for r, n in items if r == layout.END_OF_JOB_FILE]
                if end_seen:
                    end_marker = end_seen[0]
                    with self._cond:
                        self._end_held = True
                self._upload_batch([(r, n) for r, n in items if r != layout.END_OF_JOB_FILE])
                if closing:
                    for local_dir, url in self.extra_dirs:
                        self._upload_dir(local_dir, url)
                    # Side files the hook writes straight into out_dir (why a rule stopped training).
                    for name in SIDE_FILES:
                        if os.path.isfile(os.path.join(self.spool, name)):
                            self._put(name)
                    if self.worker is not None:
                        self._put_bytes(f"{WORKERS_DONE_DIR}/{self.worker}.done", b"")
                    if end_marker is not None and self.wait_for_workers:
                        self._wait_for_workers()
                    for event in self._uploaded_events.values():  # uploaded; no index file came for them
                        self._remove_from_spool(event)
                    self._uploaded_events.clear()
                    if end_marker is not None:  # last of all (docs/format.md 1.4)
                        self._put(layout.END_OF_JOB_FILE)
                        self._release(end_marker)
                    break
        except _GaveUp:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug here must not reach training
            with self._cond:
                self._gave_up = self._gave_up or f"the uploader failed: {type(exc).__name__}: {exc}"
        if self._gave_up is not None:
            self._warn_left_behind()

    def _release(self, nbytes: int) -> None:
        with self._cond:
            self._last_progress = time.monotonic()
            self._backlog_bytes -= nbytes
            self._outstanding -= 1
            self._cond.notify_all()

    def _upload_batch(self, items: List[Tuple[str, int]]) -> None:
        """Collections first; event objects concurrently; then index objects in order."""
        collections = [(r, n) for r, n in items if r.startswith(layout.COLLECTIONS_DIR + "/")]
        events = [(r, n) for r, n in items if r.startswith(layout.EVENTS_DIR + "/")]
        indexes = [(r, n) for r, n in items if r.startswith(layout.INDEX_DIR + "/")]
        others = [item for item in items if item not in collections and item not in events and item not in indexes]
        fresh = []
        for relpath, nbytes in events + indexes:
            if relpath in self._sent:  # a late step the writer published again after its upload
                logger.warning("smdebug: %s was already uploaded to %s; the later copy is not sent (objects are "
                               "written once)", relpath, self.url)
                self._release(nbytes)
            else:
                self._sent.add(relpath)
                fresh.append((relpath, nbytes))
        events = [item for item in fresh if item[0].startswith(layout.EVENTS_DIR + "/")]
        indexes = [item for item in fresh if item[0].startswith(layout.INDEX_DIR + "/")]
        indexes_set = {relpath for relpath, _ in indexes}
        for relpath, nbytes in collections:
            self._put_collections(relpath, nbytes)
            self._release(nbytes)
        # An event file stays in the spool until its index is up too: a step whose upload an
        # outage interrupts is then whole in the spool (and re-sent whole), never split.
        futures = [self._pool.submit(self._put, relpath, delete=False) for relpath, _ in events]
        for (relpath, nbytes), future in zip(events, futures):
            future.result()  # _GaveUp propagates
            self._uploaded_events[_step_file_key(relpath)] = relpath
            self._release(nbytes)
        for relpath, nbytes in sorted(indexes) + others:
            self._put(relpath)
            event = self._uploaded_events.pop(_step_file_key(relpath), None) if relpath in indexes_set else None
            if event is not None:
                self._remove_from_spool(event)
            self._release(nbytes)

    def _put_collections(self, relpath: str, nbytes: int) -> None:
        """The collections file, unless the same bytes were sent already (the hook rewrites it
        at close) or the copy notified was replaced before its upload (a later one is sent)."""
        local_path = os.path.join(self.spool, relpath)
        try:
            with open(local_path, "rb") as fh:
                digest = hashlib.sha1(fh.read()).hexdigest()
        except FileNotFoundError:  # sent already, in its newer version, in this batch
            self.stats["bytes_not_resent"] += nbytes
            return
        if self._uploaded_hashes.get(relpath) == digest:
            self.stats["bytes_not_resent"] += nbytes
            os.remove(local_path)
            return
        self._put(relpath)
        self._uploaded_hashes[relpath] = digest

    def _upload_dir(self, local_dir: str, url: str) -> None:
        """Every file below ``local_dir`` to ``url`` (closed files only: called at close)."""
        from . import remote

        if not os.path.isdir(local_dir):
            return
        fs_root = remote.filesystem(url, for_writing=True)[1] if url != self.url else self._root
        for dirpath, _, files in os.walk(local_dir):
            for name in sorted(files):
                if name.endswith(layout.TMP_SUFFIX):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                self._put(rel, local_path=path, key=self._key(rel, fs_root))


def _step_file_key(relpath: str) -> Tuple[int, str]:
    """The (step, worker) an event or index file belongs to; (-1, relpath) for any other file."""
    try:
        return layout.parse_step_and_worker(relpath.rsplit("/", 1)[-1])
    except ValueError:
        return (-1, relpath)


def spool_files(spool: str) -> List[Tuple[str, int]]:
    """The published files left in a spool, in upload order: collections, then per step its
    event and index files, anything else, the end marker last. ``(relpath, bytes)``."""
    from .remote import SPOOL_MANIFEST

    found: List[Tuple[str, int]] = []
    for dirpath, dirs, files in os.walk(spool):
        dirs.sort()
        for name in files:
            if (name.endswith(layout.TMP_SUFFIX) or name in (SPOOL_MANIFEST,) + _NEVER_UPLOADED
                    or name.startswith((".smdebug_write_test_", ".smdebug_stop_request."))):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, spool).replace(os.sep, "/")
            if rel.startswith(store.LIVE_DIR + "/"):
                continue  # a live segment goes up sealed (seal_left_live_segments), never as it is
            found.append((rel, os.path.getsize(path)))

    def order(item):
        rel = item[0]
        if rel.startswith(layout.COLLECTIONS_DIR + "/"):
            return (0, "", 0, rel)
        if rel == layout.END_OF_JOB_FILE:
            return (4, "", 0, rel)
        name = rel.rsplit("/", 1)[-1]
        if rel.startswith((layout.EVENTS_DIR + "/", layout.INDEX_DIR + "/")):
            try:
                step, worker = layout.parse_step_and_worker(name)
                return (1, f"{step:012d}_{worker}", 0 if rel.startswith(layout.EVENTS_DIR) else 1, rel)
            except ValueError:
                pass
        if rel.startswith(store.STORE_DIR + "/"):  # a segment's chunks, then its tensors, then its seal
            rank = {store.CHUNKS_DIR: 0, store.TENSORS_DIR: 1, store.STATISTICS_DIR: 2}
            return (2, "", next((v for k, v in rank.items() if rel.startswith(k + "/")), 0), rel)
        return (3, "", 0, rel)

    return sorted(found, key=order)


def sync_spool(spool: str, url: Optional[str] = None, retry_budget_s: float = 60.0,
               timeout: Optional[float] = None) -> bool:
    """Upload what a spool still holds to its URL (``smdebug-sync``); True when it is empty after."""
    from . import remote

    url = url or remote.spool_url(spool)
    extra = {}
    try:  # TensorBoard files bound for a URL of their own (remote.start_remote_writer)
        extra = dict(remote.read_manifest(spool).get("extra_dirs") or {})
    except (OSError, ValueError, TypeError):
        pass
    uploader = Uploader(spool, url, retry_budget_s=retry_budget_s,
                        extra_dirs=[(os.path.join(spool, rel), target) for rel, target in extra.items()])
    uploader.announce_close_wait = False  # no close() of a hook here: its failures say enough
    items = [item for item in spool_files(spool)
             if not any(item[0].startswith(rel.replace(os.sep, "/") + "/") for rel in extra)]
    end = [item for item in items if item[0] == layout.END_OF_JOB_FILE]
    for relpath, nbytes in items:
        if relpath != layout.END_OF_JOB_FILE:
            uploader.notify(relpath, nbytes)
    for relpath, nbytes in end:
        uploader.notify(relpath, nbytes)
    ok = uploader.close(timeout=timeout if timeout is not None else 10**9)
    if ok:
        logger.info("smdebug-sync: %d objects (%d bytes) uploaded from %s to %s", uploader.stats["objects"],
                    uploader.stats["bytes"], spool, url)
    return ok


def main(argv=None) -> int:
    """``smdebug-sync SPOOL [URL]``: finish the upload of a run left in a spool directory.

    Exit status 0 when the spool was uploaded (its files are then deleted), 1 when the
    store still refused (the files stay; run it again), 2 for a usage error.
    """
    import argparse
    import sys

    from . import remote

    parser = argparse.ArgumentParser(
        prog="smdebug-sync",
        description="Upload what a hook's spool directory still holds to its URL (the run's objects, "
                    "in the order readers expect; the end marker last). Uploaded files are deleted.")
    parser.add_argument("spool", help="the spool directory named in the hook's warning")
    parser.add_argument("url", nargs="?", help="where the run goes (default: the URL the spool was made for)")
    parser.add_argument("--retry-budget", type=float, default=60.0,
                        help="seconds of consecutive failures before giving up (default 60)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not os.path.isdir(args.spool):
        print(f"smdebug-sync: error: {args.spool} is not a directory", file=sys.stderr)
        return 2
    try:
        url = args.url or remote.spool_url(args.spool)
        if not remote.is_url(url):
            raise ValueError(f"{url!r} is not a URL (s3://bucket/prefix, ...)")
        from .store_rows import seal_left_live_segments

        seal_left_live_segments(args.spool)  # what a killed writer left live goes up sealed
        left = spool_files(args.spool)
        ok = sync_spool(args.spool, url, retry_budget_s=args.retry_budget)
    except (ValueError, ImportError) as exc:
        print(f"smdebug-sync: error: {exc}", file=sys.stderr)
        return 2
    if ok:
        print(f"smdebug-sync: {len(left)} files uploaded from {args.spool} to {url}")
        return 0
    print(f"smdebug-sync: the upload to {url} did not complete; the files stay in {args.spool}: run it again",
          file=sys.stderr)
    return 1


if __name__ == "__main__":  # python -m smdebug.storage.uploader SPOOL [URL]
    raise SystemExit(main())

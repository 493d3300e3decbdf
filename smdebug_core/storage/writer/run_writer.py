"""The background writer: one thread does all encoding and file I/O of a run.

The training thread only appends :class:`~smdebug.storage.step_data.StepData` to a bounded
queue (:meth:`RunWriter.submit`). The writer thread works in batches: it wakes when
``WAKE_AFTER_ITEMS`` items are queued, when their bytes pass a bound, on
:meth:`~RunWriter.flush` / :meth:`~RunWriter.close`, or at the latest ``max_delay`` seconds
after it last looked, and then empties the queue. A thread woken at every step preempts
the framework's compute threads at every step, and on a small machine that costs far more
than the writing itself (Keras on two cores: the same ~0.1 ms of file work per step cost
0.8 ms a step woken per step, 0.2 ms woken every 16 steps). A writer that found nothing to
do for a while sleeps until the next item comes.

What the thread does with each item lives beside this module: a step's ``events/`` and
``index/`` files in ``step_sink.py`` (the event file published first, then its index),
atomic publishing and the uploader in ``publish.py``, TensorBoard and metric lines in
``summaries.py``. A step is published when data for a different step of the same worker
arrives, or on :meth:`~RunWriter.publish` / :meth:`~RunWriter.flush` /
:meth:`~RunWriter.close`; ``training_job_end.ts`` is written last, by :meth:`~RunWriter.close`.

Errors never reach the training thread: the first I/O error is logged once, the writer
marks itself failed (:attr:`RunWriter.failed`) and discards everything after it.
"""
import collections
import logging
import os
import threading
import time

from ..format import layout, store
from ...layouts import resolve_layout
from ..step_data import ITEM_OVERHEAD_BYTES as _ITEM_OVERHEAD_BYTES, StepData
from ...modes import ModeKeys
from .publish import Publisher
from .step_sink import StepFiles
from .summaries import MetricLines, TensorBoardOutput

logger = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_BYTES = 512 * 1024 * 1024
#: The writer wakes for a batch of this many queued items (or the other reasons above).
WAKE_AFTER_ITEMS = 16
#: How long queued items may wait at most before the writer looks at them (seconds).
DEFAULT_MAX_DELAY = 0.25
# ... or when queued items hold this many bytes (large tensors: copying dominates, not waking).
_WAKE_AT_BYTES = 64 * 1024 * 1024
# After this many looks at an empty queue the writer sleeps until an item comes (an idle
# hook, between rare saves, costs no periodic wake-ups).
_IDLE_LOOKS = 8

# Queue item kinds.
_STEP, _COLLECTIONS, _METRIC, _PUBLISH, _FLUSH, _CLOSE, _FILE = range(7)


_PYARROW: list = []


def _pyarrow_works() -> bool:
    """Whether pyarrow imports; if not, one warning: the run is written in the 1.0.34 layout."""
    if not _PYARROW:
        try:
            import pyarrow.ipc
            import pyarrow.parquet  # noqa: F401

            _PYARROW.append(True)
        except Exception as exc:  # noqa: BLE001 - ImportError, or pyarrow 26's refusal of numpy 1.x
            _PYARROW.append(False)
            logger.warning(
                "smdebug: pyarrow cannot be imported (%s: %s), so this run is written in the smdebug-1.0.34 layout "
                "instead of the run store; in a numpy 1.x environment install pyarrow<26 (pip install 'pyarrow<26')",
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return _PYARROW[0]


class RunWriter:
    """Writes one run's ``events/``, ``index/``, ``collections/`` and TensorBoard files.

    ``worker`` names this process's collections file; each :class:`StepData` carries its own
    worker (several for TensorFlow MirroredStrategy). ``max_pending_bytes`` bounds the
    memory held by queued steps: :meth:`submit` blocks when it is exceeded, it never drops.
    ``max_delay`` bounds how long a submitted step waits before the writer starts on it
    (module docstring): readers of a live run see it at most that much later.
    ``run_layout``: ``"store"`` or ``"smdebug-1.0.34"`` (None: ``$SMDEBUG_LAYOUT``, else the
    default; smdebug/layouts.py); ``segment_steps`` / ``segment_seconds``: when the run
    store's segments roll (docs/format.md 10.1).
    """

    def __init__(self, out_dir, worker, tensorboard_dir=None, max_pending_bytes=DEFAULT_MAX_PENDING_BYTES,
                 max_delay=DEFAULT_MAX_DELAY, uploader=None, run_layout=None, segment_steps=None,
                 segment_seconds=None):
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.worker = layout.validate_worker(worker)
        self.tensorboard_dir = os.fspath(tensorboard_dir) if tensorboard_dir is not None else None
        if not isinstance(max_pending_bytes, int) or max_pending_bytes <= 0:
            raise ValueError(f"max_pending_bytes must be a positive integer, got {max_pending_bytes!r}")
        self.max_pending_bytes = max_pending_bytes
        if isinstance(max_delay, bool) or not isinstance(max_delay, (int, float)) or not 0 < max_delay < 3600:
            raise ValueError(f"max_delay must be a number of seconds in (0, 3600), got {max_delay!r}")
        self.max_delay = float(max_delay)
        # A remote run (storage/uploader.py): out_dir is its spool; every published file is
        # handed to the uploader, which may ask us to skip new steps while the spool is full.
        self.uploader = uploader
        self._wake_at_bytes = min(_WAKE_AT_BYTES, max_pending_bytes // 4)

        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._draining = False  # the writer empties the queue before it waits again
        self._sleeping = False  # the writer waits with no time limit: the next item wakes it
        self._pending_bytes = 0
        self._failed = None
        self._closed = False
        self._warned_behind = False
        self._warned_after_close = False
        self._pid = os.getpid()

        # Writer-thread state: one object per job.
        self._files = Publisher(self.out_dir, uploader)
        self.layout = resolve_layout(run_layout)
        if self.layout == store.STORE_LAYOUT and not _pyarrow_works():
            self.layout = store.LAYOUT_1034
        if self.layout == store.LAYOUT_1034:
            self._sink = StepFiles(self._files)
        else:
            from .store_sink import StoreSink

            self._sink = StoreSink(self._files, **{k: v for k, v in (("segment_steps", segment_steps),
                                                                     ("segment_seconds", segment_seconds))
                                                   if v is not None})
        self._tensorboard = TensorBoardOutput(self.tensorboard_dir) if self.tensorboard_dir else None
        self._metrics = MetricLines()

        self._thread = threading.Thread(target=self._run, name="smdebug-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ training-thread API

    @property
    def failed(self):
        """The exception that stopped the writer, or None."""
        return self._failed

    def _usable(self):
        # After a fork the child has this object but not the thread: writing would block.
        return os.getpid() == self._pid and self._failed is None

    def _enqueue(self, kind, payload, nbytes=_ITEM_OVERHEAD_BYTES):
        if not self._usable():
            return False
        with self._cond:
            if self._closed:
                if not self._warned_after_close:
                    self._warned_after_close = True
                    logger.warning("smdebug writer for %s is closed; data submitted after close is ignored", self.out_dir)
                return False
            while (
                self._pending_bytes > 0
                and self._pending_bytes + nbytes > self.max_pending_bytes
                and self._failed is None
            ):
                if not self._draining:
                    self._draining = True
                    self._cond.notify_all()
                if not self._warned_behind:
                    self._warned_behind = True
                    logger.warning(
                        "smdebug writer is behind: %d MiB pending (limit %d MiB); training waits for the disk",
                        self._pending_bytes >> 20, self.max_pending_bytes >> 20,
                    )
                self._cond.wait()
            if self._failed is not None:
                return False
            self._pending_bytes += nbytes
            self._queue.append((kind, payload, nbytes))
            if kind == _FLUSH:
                self._draining = True
            if self._draining or self._sleeping or self._batch_ready():
                self._cond.notify_all()
        return True

    def submit(self, step, publish=False):
        """Queue one :class:`StepData`. Never raises for I/O problems; may block when the writer is behind.

        ``publish=True`` says the step is complete: it is published as soon as it is written
        (within ``max_delay``), instead of when the worker's next step arrives (or at
        flush/close). Data arriving later for a published step is dropped with a warning.
        """
        if not isinstance(step, StepData):
            raise TypeError(f"submit() takes a StepData, got {type(step).__name__}")
        # Programming errors of the caller fail here, on its thread, not inside the writer.
        layout.validate_step(step.global_step, "StepData.global_step")
        layout.validate_step(step.mode_step, "StepData.mode_step")
        layout.validate_worker(step.worker)
        step.mode = ModeKeys.parse(step.mode)
        self._enqueue(_STEP, (step, bool(publish)), step.nbytes())

    def write_collections(self, json_bytes):
        """Write ``collections/000000000/<worker>_collections.json`` (atomically, on the writer thread)."""
        if isinstance(json_bytes, str):
            json_bytes = json_bytes.encode("utf-8")
        self._enqueue(_COLLECTIONS, bytes(json_bytes), len(json_bytes) + _ITEM_OVERHEAD_BYTES)

    def write_metric_line(self, path, line):
        """Append ``line`` (plus a newline) to the text file ``path``, on the writer thread.

        A failure here is logged once per path and does not stop the writer.
        """
        self._enqueue(_METRIC, (os.fspath(path), line))

    def write_file(self, relpath, data):
        """Write ``data`` (bytes) to ``<out_dir>/<relpath>`` atomically, on the writer thread,
        after everything queued before it (the flight recorder's marker comes after its steps)."""
        data = bytes(data)
        self._enqueue(_FILE, (relpath, data), len(data) + _ITEM_OVERHEAD_BYTES)

    def publish(self):
        """Ask the writer to publish the steps it holds open (within ``max_delay``), without waiting.

        Call it when the hook knows a step is over (e.g. at the end of training loop
        iterations after which the next save is far away). Data arriving later for a
        published step is dropped with a warning.
        """
        self._enqueue(_PUBLISH, None)

    def flush(self, timeout=None):
        """Publish all open steps and wait until everything queued is on disk.

        Returns True when done, False on timeout or if the writer has failed.
        """
        if self._closed:
            return not self._thread.is_alive() and self._failed is None
        done = threading.Event()
        if not self._enqueue(_FLUSH, done):
            return False
        started = time.monotonic()
        if not (done.wait(timeout) and self._failed is None):
            return False
        if self.uploader is not None:  # a remote run: on the store, not only in the spool
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            return self.uploader.wait_idle(left)
        return True

    def close(self, write_end_marker=True, timeout=None):
        """Publish everything, write ``training_job_end.ts`` (unless told not to) and stop the thread.

        Safe to call twice, from atexit, and in a forked child (where it does nothing).
        Returns True when the thread finished in time and nothing failed.
        """
        if os.getpid() != self._pid:
            return False
        with self._cond:
            already_closed = self._closed
            if not already_closed:
                self._closed = True
                self._queue.append((_CLOSE, bool(write_end_marker), _ITEM_OVERHEAD_BYTES))
                self._pending_bytes += _ITEM_OVERHEAD_BYTES
                self._draining = True
                self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        finished = not self._thread.is_alive()
        if not finished and not already_closed:
            logger.warning("smdebug writer did not finish within %s s; some data may be missing", timeout)
        uploaded = True
        if self.uploader is not None and not already_closed:
            # Waits for the upload with its own timeout ($SMDEBUG_UPLOAD_CLOSE_TIMEOUT); past it,
            # one warning names the spool and the command that finishes the upload.
            # A caller's timeout (a hook disabled mid-training passes 10 s) bounds this wait too.
            uploaded = self.uploader.close(timeout)
        return finished and self._failed is None and uploaded

    # ------------------------------------------------------------ writer thread

    def _run(self):
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except BaseException as exc:  # noqa: BLE001 - anything that stops us must be recorded
            self._fail(exc)
        while True:
            with self._cond:
                kind, payload, nbytes = self._next_item()
            try:
                if self._failed is None:
                    self._handle(kind, payload)
            except BaseException as exc:  # noqa: BLE001 - anything that stops the writer is recorded as its failure
                self._fail(exc)
            finally:
                if kind == _FLUSH:
                    payload.set()
                with self._cond:
                    self._pending_bytes -= nbytes
                    self._cond.notify_all()
                    ran_dry = not self._queue
            if ran_dry and self._failed is None and kind != _CLOSE:
                try:  # what was published is put where readers see it (the run store's live files)
                    self._sink.sync()
                except BaseException as exc:  # noqa: BLE001 - recorded as the writer's failure
                    self._fail(exc)
            if kind == _CLOSE:
                return

    def _batch_ready(self):
        return len(self._queue) >= WAKE_AFTER_ITEMS or self._pending_bytes >= self._wake_at_bytes

    def _next_item(self):
        """The next queued item, once there is a batch to write (called with the lock held)."""
        empty_looks = 0
        while not (self._queue and (self._draining or self._batch_ready())):
            self._draining = False
            if not self._queue and empty_looks >= _IDLE_LOOKS:
                self._sleeping = True
                self._cond.wait()
                self._sleeping = False
                empty_looks = 0
            elif not self._cond.wait(self.max_delay):
                if self._queue:
                    break  # items waited long enough
                empty_looks += 1
        self._draining = True
        return self._queue.popleft()

    def _fail(self, exc):
        # Items still queued are drained without being handled (see _run), which frees
        # their memory and wakes any submit() waiting for room.
        with self._cond:
            if self._failed is not None:
                return
            self._failed = exc
            self._cond.notify_all()
        logger.warning(
            "smdebug writer failed and stops saving data for %s: %s: %s",
            self.out_dir, type(exc).__name__, exc,
        )
        self._sink.abandon()
        if self._tensorboard is not None:
            self._tensorboard.abandon()
            self._tensorboard = None

    def _handle(self, kind, payload):
        if kind == _STEP:
            step, publish = payload
            self._sink.write_step(step)
            if self._tensorboard is not None:
                self._tensorboard.write_step(step)
            if publish:
                self._sink.publish(step.worker)
        elif kind == _COLLECTIONS:
            self._files.write_atomically(layout.collections_file_relpath(self.worker), payload)
        elif kind == _METRIC:
            self._metrics.append(*payload)
        elif kind == _FILE:
            self._files.write_atomically(*payload)
        elif kind == _FLUSH and self.uploader is not None:
            self._sink.seal_all()  # a remote run: what is sealed is what readers of the store see
            if self._tensorboard is not None:
                self._tensorboard.flush()
        elif kind in (_PUBLISH, _FLUSH):
            self._sink.publish_all()
            if kind == _FLUSH:
                self._sink.sync()
            if self._tensorboard is not None:
                self._tensorboard.flush()
        elif kind == _CLOSE:
            self._sink.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
                self._tensorboard = None
            if payload:
                self._files.write_atomically(layout.END_OF_JOB_FILE, b"")

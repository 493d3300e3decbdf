"""The background writer: one thread does all encoding and file I/O of a run.

The training thread only appends :class:`~smdebug.storage.step_data.StepData` to a queue (:meth:`RunWriter.submit`).
The writer thread works in batches: it wakes when ``WAKE_AFTER_ITEMS`` items are queued,
when their bytes pass a bound, on :meth:`~RunWriter.flush` / :meth:`~RunWriter.close`, or
at the latest ``max_delay`` seconds after it last looked, and then empties the queue. A
thread woken at every step preempts the framework's compute threads at every step, and on
a small machine that costs far more than the writing itself (Keras on two cores: the same
~0.1 ms of file work per step cost 0.8 ms a step woken per step, 0.2 ms woken every 16
steps). A writer that found nothing to do for a while sleeps until the next item comes.

The writer thread streams each step's records into ``<event file>.tmp``, and publishes
the step when data for a different step of the same worker arrives, or on
:meth:`~RunWriter.flush` / :meth:`~RunWriter.close`:

1. the event file is closed and renamed into place,
2. then the index file is written as ``.tmp`` and renamed into place.

So a reader (or a ``kill -9``) never sees a half-written file under a final name, and every
published index points to a complete event file. ``training_job_end.ts`` is written last,
by :meth:`~RunWriter.close`. No fsync: a process crash loses nothing that was renamed,
only a machine crash could.

Errors never reach the training thread: the first I/O error is logged once, the writer
marks itself failed (:attr:`RunWriter.failed`) and discards everything after it.
"""
import collections
import itertools
import logging
import os
import threading
import time

from ..format import layout
from ..format.codec import StepEncoder
from ..format.index import entry_json, index_json_from_items
from ..format.record_templates import EVENT_FOOTER, ScalarRunLayout, SmallRecordsLayout
from ..format.records import RECORD_OVERHEAD, crc32c, crc32c_of_parts, crc32c_of_slices, record_header
from ..step_data import ITEM_OVERHEAD_BYTES as _ITEM_OVERHEAD_BYTES, ScalarRun, StepData, iter_records
from ...modes import ModeKeys
from .tensorboard import TensorBoardWriter, reduction_scalars

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


class _OpenStep:
    """A step whose records are being written to ``<event file>.tmp`` and not yet published."""

    def __init__(self, global_step, worker, mode, mode_step):
        self.global_step = global_step
        self.worker = worker
        self.mode = mode
        self.mode_step = mode_step
        self.event_relpath = layout.event_file_relpath(global_step, worker)
        self.index_relpath = layout.index_file_relpath(global_step, worker)
        self.handle = None
        self.offset = 0
        self.names = []  # of the records written, in order
        self.index_items = []  # their index entries, formatted: one each, or runs of them (format.index)
        self.shapes = []
        self.placements = {}
        self.warned_mode_mismatch = False


_EVENT_FILE_BUFFER_BYTES = 1 << 20

# Steps with fewer records are written one record at a time.
_LAYOUT_MIN_RECORDS = 8
_MAX_LAYOUTS = 64
# A run's layout holds its template and byte offsets (~0.5 KB a record): at most this many.
_MAX_RUN_LAYOUTS = 16


_MAX_KNOWN_DIRS = 4096
# out_dir is absolute (os.path.abspath): joining with "/" gives a valid path on POSIX, even for out_dir "/".
_POSIX_PATHS = os.sep == "/"
_O_CLOEXEC_BINARY = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)

# Queue item kinds.
_STEP, _COLLECTIONS, _METRIC, _PUBLISH, _FLUSH, _CLOSE, _FILE = range(7)


class RunWriter:
    """Writes one run's ``events/``, ``index/``, ``collections/`` and TensorBoard files.

    ``worker`` names this process's collections file; each :class:`StepData` carries its own
    worker (several for TensorFlow MirroredStrategy). ``max_pending_bytes`` bounds the
    memory held by queued steps: :meth:`submit` blocks when it is exceeded, it never drops.
    ``max_delay`` bounds how long a submitted step waits before the writer starts on it
    (module docstring): readers of a live run see it at most that much later.
    """

    def __init__(self, out_dir, worker, tensorboard_dir=None, max_pending_bytes=DEFAULT_MAX_PENDING_BYTES,
                 max_delay=DEFAULT_MAX_DELAY, uploader=None):
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.worker = layout.validate_worker(worker)
        self.tensorboard_dir = os.fspath(tensorboard_dir) if tensorboard_dir is not None else None
        if not isinstance(max_pending_bytes, int) or max_pending_bytes <= 0:
            raise ValueError(f"max_pending_bytes must be a positive integer, got {max_pending_bytes!r}")
        self.max_pending_bytes = max_pending_bytes
        if isinstance(max_delay, bool) or not isinstance(max_delay, (int, float)) or not 0 < max_delay < 3600:
            raise ValueError(f"max_delay must be a number of seconds in (0, 3600), got {max_delay!r}")
        self.max_delay = float(max_delay)
        # A remote run (writer/uploader.py): out_dir is its spool; every published file is
        # handed to the uploader, which may ask us to skip new steps while the spool is full.
        self.uploader = uploader
        self._warned_spool_full = False
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

        # Writer-thread state.
        self._open_steps = {}  # worker -> _OpenStep
        self._known_dirs = set()
        self._layouts = {}  # -> SmallRecordsLayout of recent steps
        self._run_layouts = {}  # -> ScalarRunLayout of recent ScalarRuns
        self._tensorboard = TensorBoardWriter(self.tensorboard_dir) if self.tensorboard_dir else None
        self._warned_encode = set()
        self._warned_late = set()
        self._warned_metric_paths = set()
        self._metric_paths_ready = set()  # paths whose directory exists (made at the first line)

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
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)
            finally:
                if kind == _FLUSH:
                    payload.set()
                with self._cond:
                    self._pending_bytes -= nbytes
                    self._cond.notify_all()
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
        for open_step in self._open_steps.values():
            if open_step.handle is not None:
                try:
                    open_step.handle.close()
                except OSError:
                    pass
        self._open_steps.clear()
        if self._tensorboard is not None:
            try:
                self._tensorboard.close()
            except OSError:
                pass
            self._tensorboard = None

    def _handle(self, kind, payload):
        if kind == _STEP:
            step, publish = payload
            self._write_step(step)
            if publish and step.worker in self._open_steps:
                self._publish(self._open_steps[step.worker])
        elif kind == _COLLECTIONS:
            self._write_atomically(layout.collections_file_relpath(self.worker), payload)
        elif kind == _METRIC:
            self._append_metric_line(*payload)
        elif kind == _FILE:
            self._write_atomically(*payload)
        elif kind in (_PUBLISH, _FLUSH):
            self._publish_all()
            self._flush_tensorboard()
        elif kind == _CLOSE:
            self._publish_all()
            self._close_tensorboard()
            if payload:
                self._write_atomically(layout.END_OF_JOB_FILE, b"")

    def _append_metric_line(self, path, line):
        # Metric files live outside out_dir; losing them must not stop tensor saving.
        try:
            if path not in self._metric_paths_ready:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                self._metric_paths_ready.add(path)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{line}\n")
        except OSError as exc:
            if path not in self._warned_metric_paths:
                self._warned_metric_paths.add(path)
                logger.warning("smdebug cannot append metrics to %s: %s: %s", path, type(exc).__name__, exc)

    # -- files

    def _path(self, relpath):
        if _POSIX_PATHS:  # a few string operations less for each of a step's files
            return f"{self.out_dir}/{relpath}"
        return layout.join_under(self.out_dir, relpath)

    def _ensure_parent(self, relpath):
        self._ensure_dir(relpath.rpartition("/")[0])

    def _ensure_dir(self, rel_dir):
        # mkdir one level at a time below out_dir: if out_dir itself was deleted, this fails
        # instead of silently recreating it.
        if not rel_dir or rel_dir in self._known_dirs:
            return
        self._ensure_dir(rel_dir.rpartition("/")[0])
        try:
            os.mkdir(self._path(rel_dir))
        except FileExistsError:
            pass
        if len(self._known_dirs) >= _MAX_KNOWN_DIRS:  # every saved step has its own events/ directory
            self._known_dirs.clear()
        self._known_dirs.add(rel_dir)

    def _write_atomically(self, relpath, data):
        self._ensure_parent(relpath)
        final = self._path(relpath)
        tmp = final + layout.TMP_SUFFIX
        # One write of bytes in hand: os.open spares the file object's fstat, ioctl and lseek.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC_BINARY, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, final)
        if self.uploader is not None:
            self.uploader.notify(relpath, len(data))

    # -- steps

    def _write_step(self, step):
        mode = step.mode
        open_step = self._open_steps.get(step.worker)
        if open_step is not None and open_step.global_step != step.global_step:
            self._publish(open_step)
            open_step = None
        if open_step is None and (step.tensors or step.shapes):
            open_step = _OpenStep(step.global_step, step.worker, mode, step.mode_step)
            if not step.replace and os.path.exists(self._path(open_step.index_relpath)):
                self._warn_late(step)
                open_step = None
            elif self.uploader is not None and self.uploader.spool_full():
                open_step = None  # the uploader warned once; training must not wait for the network
            else:
                self._open_steps[step.worker] = open_step
        if open_step is not None:
            if (mode, step.mode_step) != (open_step.mode, open_step.mode_step) and not open_step.warned_mode_mismatch:
                open_step.warned_mode_mismatch = True
                logger.warning(
                    "step %d of %s was opened as %s step %d; data submitted as %s step %d is filed under the former",
                    step.global_step, step.worker, open_step.mode.name, open_step.mode_step, mode.name, step.mode_step,
                )
            encoder = StepEncoder(global_step=open_step.global_step, mode=open_step.mode,
                                  mode_step=open_step.mode_step, wall_time=step.wall_time)
            self._write_records(open_step, encoder, step.tensors)
            if step.placements:
                open_step.placements.update(step.placements)
            for shape_item in step.shapes:
                name, *original, shape = shape_item
                open_step.shapes.append((name, original[0] if original else name, tuple(int(s) for s in shape)))
        if self._tensorboard is not None:
            # Saved reductions go to TensorBoard as scalars too (docs/format.md 6).
            reductions = reduction_scalars(iter_records(step.tensors))
            if step.tb_scalars or step.tb_histograms or reductions:
                self._write_tensorboard(mode, step, reductions)

    def _event_file(self, open_step):
        """The step's ``<event file>.tmp``, opened at its first record."""
        if open_step.handle is None:
            self._ensure_parent(open_step.event_relpath)
            # A large buffer: many small records cost memory copies, not syscalls.
            open_step.handle = open(self._path(open_step.event_relpath) + layout.TMP_SUFFIX, "wb",
                                    buffering=_EVENT_FILE_BUFFER_BYTES)
        return open_step.handle

    def _write_records(self, open_step, encoder, tensors):
        """Append records to the step's event file, in order: runs of pairs and
        :class:`ScalarRun` items."""
        for kind, items in itertools.groupby(tensors, type):
            if kind is ScalarRun:
                for run in items:
                    if not self._write_run(open_step, encoder, run):
                        self._write_pairs(open_step, encoder, run.pairs())
            else:
                self._write_pairs(open_step, encoder, list(items))

    def _write_run(self, open_step, encoder, run):
        """Write a :class:`ScalarRun` through its cached :class:`ScalarRunLayout`; False
        (nothing written) when its tags cannot be small records."""
        if len(run) < _LAYOUT_MIN_RECORDS:
            return False
        key = (run.tags, len(encoder.head), len(encoder.metadata_field))
        layout_ = self._run_layouts.get(key)
        try:
            if layout_ is None:
                layout_ = ScalarRunLayout(encoder, run.tags)
                if len(self._run_layouts) >= _MAX_RUN_LAYOUTS:  # runs keep changing: do not grow forever
                    self._run_layouts.clear()
                self._run_layouts[key] = layout_
            data, crcs = layout_.fill(encoder, run.values)
        except (ValueError, TypeError):
            return False
        self._append_records(open_step, data, run.tags, layout_, crcs.tolist())
        return True

    def _append_records(self, open_step, data, tags, layout_, crcs):
        """Records joined from a layout's template (``data``) into the step's event file and index."""
        self._event_file(open_step).write(data)
        open_step.names += tags
        open_step.index_items.append(layout_.index_template(open_step.offset) % tuple(crcs))
        open_step.offset += len(data)

    def _write_pairs(self, open_step, encoder, tensors):
        """Append ``(tag, value)`` records. This thread holds the GIL while it encodes, and
        a step may hold hundreds of small records: see :class:`SmallRecordsLayout` for the
        usual case, a step like the previous one."""
        if len(tensors) >= _LAYOUT_MIN_RECORDS and self._write_like_before(open_step, encoder, tensors):
            return
        handle, names, items, offset = open_step.handle, open_step.names, open_step.index_items, open_step.offset
        write = handle.write if handle is not None else None
        try:
            for tag, value in tensors:
                try:
                    parts = encoder.encode(tag, value)
                except (TypeError, ValueError) as exc:
                    # A bad value is the caller's problem for that one tensor, not the run's.
                    if tag not in self._warned_encode:
                        self._warned_encode.add(tag)
                        logger.warning("smdebug cannot save tensor %r (skipped): %s", tag, exc)
                    continue
                if write is None:
                    write = self._event_file(open_step).write
                if len(parts) == 1:  # small record: one write call
                    payload = parts[0]
                    length = len(payload)
                    write(b"".join((record_header(length), payload, EVENT_FOOTER)))
                    crc = crc32c(payload)
                else:  # large tensor: its bytes go to the file straight from the array
                    length = sum(len(part) for part in parts)
                    write(record_header(length))
                    for part in parts:
                        write(part)
                    write(EVENT_FOOTER)
                    crc = crc32c_of_parts(parts)
                names.append(tag)
                items.append(entry_json(tag, offset, length + RECORD_OVERHEAD, crc))
                offset += length + RECORD_OVERHEAD
        finally:
            open_step.offset = offset

    def _write_like_before(self, open_step, encoder, tensors):
        """Write ``tensors`` through a cached :class:`SmallRecordsLayout`; False (nothing
        written) when they are not all small plain arrays."""
        tags, arrays = zip(*tensors)
        key = (tags, len(encoder.head), len(encoder.metadata_field))
        layout_ = self._layouts.get(key)
        try:
            if layout_ is None or not layout_.fits(arrays):
                layout_ = SmallRecordsLayout.build(encoder, tags, arrays)
                if layout_ is None:
                    return False
                if len(self._layouts) >= _MAX_LAYOUTS:  # steps keep changing: do not grow forever
                    self._layouts.clear()
                self._layouts[key] = layout_
            data = layout_.join(encoder, arrays)
        except (AttributeError, BufferError, ValueError, TypeError):  # not arrays, not contiguous: one by one
            return False
        self._append_records(open_step, data, tags, layout_, crc32c_of_slices(data, layout_.payloads))
        return True

    def _publish(self, open_step):
        """Event file into place first, then its index (docs/format.md 1.4)."""
        del self._open_steps[open_step.worker]
        event_relpath = None
        if open_step.handle is not None:
            open_step.handle.close()
            final = self._path(open_step.event_relpath)
            os.replace(final + layout.TMP_SUFFIX, final)
            event_relpath = open_step.event_relpath
            if self.uploader is not None:
                self.uploader.notify(event_relpath, open_step.offset)
        shapes = open_step.shapes
        if shapes:  # a shape entry would hide the raw value of the same name from the original reader (docs/format.md 3.2)
            written = set(open_step.names)
            shapes = [item for item in shapes if item[0] not in written]
        if not open_step.index_items and not shapes:
            return
        placements = {name: p for name, p in open_step.placements.items() if name in set(open_step.names)} \
            if open_step.placements else None
        index = index_json_from_items(open_step.mode, open_step.mode_step, event_relpath, open_step.index_items,
                                      shapes, placements)
        self._write_atomically(open_step.index_relpath, index)

    def _publish_all(self):
        for open_step in list(self._open_steps.values()):
            self._publish(open_step)

    def _warn_late(self, step):
        key = (step.global_step, step.worker)
        if key not in self._warned_late:
            self._warned_late.add(key)
            names = [name for name, _ in iter_records(step.tensors)] + [name for name, _ in step.shapes]
            logger.warning(
                "smdebug dropped %d tensor(s) for step %d of %s: that step was already published (%s)",
                len(names), step.global_step, step.worker, ", ".join(names[:5]) + ("..." if len(names) > 5 else ""),
            )

    # -- TensorBoard: its failures disable TensorBoard output only, not the run's data.

    def _write_tensorboard(self, mode, step, reductions=()):
        try:
            scalars = list(step.tb_scalars) + reductions if reductions else step.tb_scalars
            # Each mode is its own TensorBoard run, stepped by the mode's own step.
            self._tensorboard.write_summaries(
                mode, step.global_step, scalars, step.tb_histograms, wall_time=step.wall_time,
                event_step=step.mode_step,
            )
        except OSError as exc:
            self._disable_tensorboard(exc)
        except Exception as exc:  # noqa: BLE001 - a bad value must not stop tensor saving
            logger.warning("smdebug skipped TensorBoard summaries of step %d: %s: %s",
                           step.global_step, type(exc).__name__, exc)

    def _flush_tensorboard(self):
        if self._tensorboard is not None:
            try:
                self._tensorboard.flush()
            except OSError as exc:
                self._disable_tensorboard(exc)

    def _close_tensorboard(self):
        if self._tensorboard is not None:
            try:
                self._tensorboard.close()
            except OSError as exc:
                self._disable_tensorboard(exc)
            self._tensorboard = None

    def _disable_tensorboard(self, exc):
        logger.warning(
            "smdebug stops writing TensorBoard files to %s: %s: %s", self.tensorboard_dir, type(exc).__name__, exc
        )
        tensorboard, self._tensorboard = self._tensorboard, None
        try:
            tensorboard.close()
        except OSError:
            pass

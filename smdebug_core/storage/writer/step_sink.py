"""A step's files: its records streamed into ``<event file>.tmp``, then published.

Each (global step, worker) is open while its data arrives; publishing it (when data for
another step of that worker arrives, or when asked) puts it on disk in this order:

1. the event file is closed and renamed into place,
2. then the index file is written as ``.tmp`` and renamed into place,

so every published index points to a complete event file (docs/format.md 1.4).

Records are encoded here, on the writer thread, which holds the GIL while it does: a step
like the previous one (the usual case) goes through the cached templates of
``format/record_templates.py`` instead of one record at a time.
"""
import itertools
import logging

from ..format.codec import StepEncoder
from ..format.index import complete_entries, entry_json, index_json_from_items
from ..format.record_templates import EVENT_FOOTER, ScalarRunLayout, SmallRecordsLayout
from ..format.records import RECORD_OVERHEAD, append_record, crc32c_of_slices
from ..format import layout
from ..step_data import ScalarRun, iter_records

logger = logging.getLogger(__name__)

_EVENT_FILE_BUFFER_BYTES = 1 << 20
#: Workers whose last published step late records may still join (one writer rarely has more).
_MAX_REOPENABLE_WORKERS = 64
# Steps with fewer records are written one record at a time.
_LAYOUT_MIN_RECORDS = 8
_MAX_LAYOUTS = 64
# A run's layout holds its template, offsets and index entries (a few hundred bytes a record): at most this many.
_MAX_RUN_LAYOUTS = 16


def encode_or_warn(encoder, tag, value, warned: set):
    """The record parts of ``(tag, value)`` (``StepEncoder.encode``), or None after one warning
    per tag: a bad value is the caller's problem for that one tensor, not the run's."""
    try:
        return encoder.encode(tag, value)
    except (TypeError, ValueError) as exc:
        if tag not in warned:
            warned.add(tag)
            logger.warning("smdebug cannot save tensor %r (skipped): %s", tag, exc)
        return None


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
        self.appending = False  # reopened after it was published (records that came late)


class StepFiles:
    """Writes the ``events/`` and ``index/`` files of submitted steps through ``publisher``
    (:class:`~.publish.Publisher`). Used by the writer thread only."""

    def __init__(self, publisher):
        self._files = publisher
        self._open_steps = {}  # worker -> _OpenStep
        self._layouts = {}  # -> SmallRecordsLayout of recent steps
        self._run_layouts = {}  # -> ScalarRunLayout of recent ScalarRuns
        self._warned_encode = set()
        self._warned_late = set()
        self._last_published = {}  # worker -> its last published _OpenStep, which late data may still join

    def write_step(self, step):
        """Add one :class:`~smdebug.storage.step_data.StepData` to its open step (opening it,
        and publishing the worker's previous step, as needed)."""
        mode = step.mode
        open_step = self._open_steps.get(step.worker)
        if open_step is not None and open_step.global_step != step.global_step:
            self._publish(open_step)
            open_step = None
        if open_step is None and (step.tensors or step.shapes):
            open_step = _OpenStep(step.global_step, step.worker, mode, step.mode_step)
            if not step.replace and self._files.exists(open_step.index_relpath):
                open_step = self._reopen(step)
                if open_step is None:
                    self._warn_late(step)
                else:
                    self._open_steps[step.worker] = open_step
            elif self._files.spool_full():
                open_step = None  # the uploader warned once; training must not wait for the network
            else:
                self._open_steps[step.worker] = open_step
        if open_step is None:
            return
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

    def publish(self, worker):
        """Publish ``worker``'s open step, if it has one."""
        open_step = self._open_steps.get(worker)
        if open_step is not None:
            self._publish(open_step)

    def publish_all(self):
        for open_step in list(self._open_steps.values()):
            self._publish(open_step)

    def sync(self):
        """Nothing to do: every published step is in its own files already."""

    def seal_all(self):
        self.publish_all()

    def close(self):
        self.publish_all()

    def abandon(self):
        """Close the open steps' files without publishing them (the writer failed)."""
        for open_step in self._open_steps.values():
            if open_step.handle is not None:
                try:
                    open_step.handle.close()
                except OSError:
                    pass
        self._open_steps.clear()

    # -- records

    def _event_file(self, open_step):
        """The step's ``<event file>.tmp``, opened at its first record."""
        if open_step.handle is None:
            # A large buffer: many small records cost memory copies, not syscalls.
            open_step.handle = self._files.open_tmp(open_step.event_relpath, _EVENT_FILE_BUFFER_BYTES)
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
        open_step.index_items.append(complete_entries(layout_.index_template(open_step.offset), crcs))
        open_step.offset += len(data)

    def _write_pairs(self, open_step, encoder, tensors):
        """Append ``(tag, value)`` records. A step may hold hundreds of small records: see
        :class:`SmallRecordsLayout` for the usual case, a step like the previous one."""
        if len(tensors) >= _LAYOUT_MIN_RECORDS and self._write_like_before(open_step, encoder, tensors):
            return
        handle, names, items, offset = open_step.handle, open_step.names, open_step.index_items, open_step.offset
        write = handle.write if handle is not None else None
        try:
            for tag, value in tensors:
                parts = encode_or_warn(encoder, tag, value, self._warned_encode)
                if parts is None:
                    continue
                if write is None:
                    write = self._event_file(open_step).write
                length, crc = append_record(write, parts, EVENT_FOOTER)
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

    # -- publishing

    def _reopen(self, step):
        """The worker's last published step, reopened to append ``step``'s records (a scalar
        saved after training ended, in the step it ended on), or None. Local runs only: an
        uploaded file is not sent again. Readers are not disturbed: the records go after those
        the published index names, and the index is replaced atomically at the next publish."""
        last = self._last_published.get(step.worker)
        if last is None or last.global_step != step.global_step or self._files.uploader is not None \
                or not last.offset or not self._files.exists(last.event_relpath):
            return None
        last.handle = self._files.open_append(last.event_relpath, _EVENT_FILE_BUFFER_BYTES)
        last.appending = True
        return last

    def _publish(self, open_step):
        """Event file into place first, then its index (docs/format.md 1.4)."""
        del self._open_steps[open_step.worker]
        event_relpath = None
        if open_step.handle is not None:
            open_step.handle.close()
            open_step.handle = None
            if not open_step.appending:  # an appended file is in place already
                self._files.publish_tmp(open_step.event_relpath, open_step.offset)
            event_relpath = open_step.event_relpath
            if len(self._last_published) >= _MAX_REOPENABLE_WORKERS:
                self._last_published.clear()
            self._last_published[open_step.worker] = open_step
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
        self._files.write_atomically(open_step.index_relpath, index)

    def _warn_late(self, step):
        key = (step.global_step, step.worker)
        if key not in self._warned_late:
            self._warned_late.add(key)
            names = [name for name, _ in iter_records(step.tensors)] + [name for name, _ in step.shapes]
            logger.warning(
                "smdebug dropped %d tensor(s) for step %d of %s: that step was already published (%s)",
                len(names), step.global_step, step.worker, ", ".join(names[:5]) + ("..." if len(names) > 5 else ""),
            )

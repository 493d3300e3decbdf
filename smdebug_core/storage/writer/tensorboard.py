"""TensorBoard event files: scalars and histograms, one subdirectory per mode (docs/format.md 6).

Files are standard TFRecord with real payload CRCs, start with a ``brain.Event:2``
file-version event, and use the global step as ``Event.step``. One file per mode per
writer: ``{tb_dir}/{MODE}/{first global step:012d}_{pid}_{hostname}.tfevents``.

Not thread-safe: :class:`~smdebug.storage.writer.RunWriter` calls it from its own thread only.
"""
import logging
import os
import re
import socket
import time

import numpy as np

from ..format import proto
from ..format.codec import is_real_number_dtype
from ..format.layout import join_under, tensorboard_file_relpath
from ..format.records import frame_record
from ...modes import ModeKeys
from ...reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag, reduction_label

logger = logging.getLogger(__name__)

FILE_VERSION = "brain.Event:2"
_TAG_UNSAFE = re.compile(r"[^-/\w.]")


def clean_tag(name):
    """TensorBoard tag of a tensor name: characters outside ``[-/\\w.]`` become ``_``, leading ``/`` go."""
    return _TAG_UNSAFE.sub("_", name).lstrip("/")


def short_tag(tag):
    """A histogram tag ``<collection>/<tensor>`` without the collection when the tensor's name
    already says it: Keras' ``hidden/weights/planes/hidden/kernel`` in ``weights`` stays as it
    is (not ``weights/hidden/weights/...``), PyTorch's ``gradient/Net_fc1.weight`` in
    ``gradients`` too; ``Net_fc1.weight`` becomes ``weights/Net_fc1.weight``."""
    collection, sep, name = tag.partition("/")
    if not sep:
        return tag
    parts = name.split("/")
    if collection in parts or (collection.endswith("s") and collection[:-1] in parts):
        return name
    return tag


def reduction_scalars(tensors):
    """``(tag, value)`` TensorBoard scalars for the saved reductions among a step's records:
    ``smdebug/reductions/abs_max/<tensor>`` becomes ``<tensor>/abs_max``."""
    out = []
    for tag, value in tensors:
        if REDUCTION_TAG_PREFIX in tag:
            parsed = parse_reduction_tag(tag)
            if parsed is not None:
                op, is_abs, name = parsed
                out.append((f"{name}/{reduction_label(op, is_abs)}", value))
    return out


def _default_bucket_edges():
    # TensorFlow's default histogram buckets: +-1e-12 * 1.1**k up to 1e20, and 0.
    positive = []
    edge = 1e-12
    while edge < 1e20:
        positive.append(edge)
        edge *= 1.1
    positive = np.array(positive)
    return np.concatenate([-positive[::-1], [0.0], positive])


#: 1,549 edges, as in docs/format.md 6.
DEFAULT_BUCKET_EDGES = _default_bucket_edges()


def make_histogram(values, edges=DEFAULT_BUCKET_EDGES):
    """A ``HistogramProto`` of ``values``, or None for data that has no histogram.

    Bool, complex, string, empty and non-finite data give None. Values beyond the outer
    edges are counted in the outermost buckets so that ``num`` is the element count.
    Empty buckets are trimmed on both sides, keeping one empty bucket on the left.
    """
    arr = np.asarray(values)
    if arr.size == 0 or not is_real_number_dtype(arr.dtype):
        return None
    flat = arr.astype(np.float64).reshape(-1)
    if not np.isfinite(flat).all():
        return None
    counts, _ = np.histogram(np.clip(flat, edges[0], edges[-1]), bins=edges)
    nonzero = np.flatnonzero(counts)
    first, last = int(nonzero[0]), int(nonzero[-1])
    low = first - 1 if first > 0 else 0
    bucket = counts[low : last + 1].astype(np.float64)
    bucket_limit = edges[low + 1 : last + 2]
    if first == 0:  # keep an empty bucket on the left even at the outermost edge
        bucket = np.concatenate([[0.0], bucket])
        bucket_limit = np.concatenate([edges[:1], bucket_limit])
    histo = proto.HistogramProto(
        min=float(flat.min()),
        max=float(flat.max()),
        num=float(flat.size),
        sum=float(flat.sum()),
        sum_squares=float(np.dot(flat, flat)),
    )
    histo.bucket_limit.extend(bucket_limit.tolist())
    histo.bucket.extend(bucket.tolist())
    return histo


def _scalar_value(value):
    arr = np.asarray(value)
    if arr.size != 1 or not (arr.dtype.kind == "b" or is_real_number_dtype(arr.dtype)):
        return None
    return float(arr.reshape(-1)[0])


class TensorBoardWriter:
    """Appends scalar and histogram summaries to one event file per mode under ``tb_dir``."""

    def __init__(self, tb_dir):
        self.tb_dir = os.fspath(tb_dir)
        self._files = {}
        self._pid = os.getpid()
        self._hostname = socket.gethostname()

    def _file_for(self, mode, global_step, wall_time):
        handle = self._files.get(mode)
        if handle is None:
            relpath = tensorboard_file_relpath(mode, global_step, self._pid, self._hostname)
            path = join_under(self.tb_dir, relpath)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = open(path, "ab")
            version = proto.Event(wall_time=wall_time, file_version=FILE_VERSION)
            handle.write(frame_record(version.SerializeToString(), real_payload_crc=True))
            self._files[mode] = handle
        return handle

    def write_summaries(self, mode, global_step, scalars=(), histograms=(), wall_time=None, event_step=None):
        """Write one ``Event`` holding the step's scalars (``simple_value``) and histograms.

        ``scalars``: ``(tag, number)``; ``histograms``: ``(tag, array)``. Tags are cleaned
        here, histogram tags shortened (:func:`short_tag`). Values that cannot be shown
        (non-scalar "scalars", bool/empty/non-finite histogram data) are skipped with a
        debug log. ``Event.step`` is ``event_step`` (the writer passes the mode step: each
        mode is a TensorBoard run of its own) or else ``global_step``, which also names the
        file. Returns the number of values written.
        """
        mode = ModeKeys.parse(mode)
        wall_time = time.time() if wall_time is None else wall_time
        summary = proto.Summary()
        for tag, value in scalars:
            number = _scalar_value(value)
            if number is None:
                logger.debug("TensorBoard: %r is not a single real number, no scalar written", tag)
                continue
            summary.value.add(tag=clean_tag(tag), simple_value=number)
        for tag, values in histograms:
            histo = make_histogram(values)
            if histo is None:
                logger.debug("TensorBoard: no histogram for %r (bool, empty, complex or non-finite data)", tag)
                continue
            summary.value.add(tag=clean_tag(short_tag(tag))).histo.CopyFrom(histo)
        if not summary.value:
            return 0
        event = proto.Event(wall_time=wall_time, step=global_step if event_step is None else event_step)
        event.summary.CopyFrom(summary)
        self._file_for(mode, global_step, wall_time).write(frame_record(event.SerializeToString(), real_payload_crc=True))
        return len(summary.value)

    def flush(self):
        for handle in self._files.values():
            handle.flush()

    def close(self):
        files, self._files = self._files, {}
        for handle in files.values():
            handle.close()

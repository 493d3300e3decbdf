"""Where every file of a run lives, relative to the run directory (docs/format.md 1.1, 1.2).

All returned paths use ``/`` as separator: they are written into index files as-is
and joined onto a local directory with :func:`join_under`.
"""
import operator
import os
import re

from ...modes import ModeKeys

#: The empty marker that says "training finished" (docs/format.md 1.3).
END_OF_JOB_FILE = "training_job_end.ts"
#: Suffix of a file that is still being written; readers never match it.
TMP_SUFFIX = ".tmp"
EVENTS_DIR = "events"
INDEX_DIR = "index"
#: The "collection step" directory is always 0 (docs/format.md 1.2).
COLLECTIONS_DIR = "collections/000000000"
COLLECTIONS_SUFFIX = "_collections.json"
EVENT_FILE_SUFFIX = ".tfevents"
INDEX_FILE_SUFFIX = ".json"
#: Folder of the flight recorder's markers, one ``trigger-<worker>.json`` each (docs/format.md).
MARKER_DIR = "flight_recorder"

#: The most bytes a reader reads of one index file. The format sets no size, but an index
#: entry takes about 100 bytes: 64 MiB is over half a million records in one step of one
#: worker, far beyond any real step. A bigger file is refused unread (docs/reader_safety.md).
MAX_INDEX_FILE_BYTES = 64 << 20
#: The most bytes a reader reads of one collections file: a few KiB of configs plus the
#: explicit tensor names of each collection (the same bound as an index file).
MAX_COLLECTIONS_FILE_BYTES = 64 << 20

#: Steps are zero-padded to 12 digits and sorted as text, so they must stay below 10**12.
MAX_STEP_EXCLUSIVE = 10**12

_STEP_DIGITS = re.compile(r"[0-9]+")
# Base names of index/event files: "<digits>_<worker>.<ext>".
_DATA_FILE_SUFFIXES = (".json", ".csv", ".tfevents")


def validate_step(step, what="step"):
    """Return ``step`` as an int, or raise ValueError unless it is an integer in [0, 10**12)."""
    if isinstance(step, bool):
        raise ValueError(f"{what} must be an integer, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {step!r}") from None
    if not 0 <= value < MAX_STEP_EXCLUSIVE:
        raise ValueError(f"{what} must be in [0, {MAX_STEP_EXCLUSIVE}), got {value}")
    return value


def validate_worker(worker):
    """Return ``worker`` or raise ValueError if it cannot be a file-name component."""
    if not isinstance(worker, str) or not worker:
        raise ValueError(f"worker name must be a non-empty string, got {worker!r}")
    if "/" in worker or "\\" in worker or "\x00" in worker or ".." in worker:
        raise ValueError(
            f"worker name {worker!r} must not contain '/', '\\', NUL or '..'"
            " (MirroredStrategy device names must go through serialize_worker_name)"
        )
    return worker


def event_file_relpath(step, worker):
    """``events/{step:012d}/{step:012d}_{worker}.tfevents``."""
    s = validate_step(step)
    validate_worker(worker)
    return f"{EVENTS_DIR}/{s:012d}/{s:012d}_{worker}{EVENT_FILE_SUFFIX}"


def index_file_relpath(step, worker):
    """``index/{step // 1000:09d}/{step:012d}_{worker}.json``."""
    s = validate_step(step)
    validate_worker(worker)
    return f"{INDEX_DIR}/{s // 1000:09d}/{s:012d}_{worker}{INDEX_FILE_SUFFIX}"


def collections_file_relpath(worker):
    """``collections/000000000/{worker}_collections.json``."""
    validate_worker(worker)
    return f"{COLLECTIONS_DIR}/{worker}{COLLECTIONS_SUFFIX}"


def parse_step_and_worker(filename):
    """Split an index or event file name (or path) into ``(global_step, worker)``.

    ``"000000000012_worker_0.json"`` -> ``(12, "worker_0")``. Raises ValueError for names
    that do not follow the format (no digits before the first ``_``, a step of 10**12 or
    more, an empty worker, an unknown extension).
    """
    base = str(filename).replace("\\", "/").rsplit("/", 1)[-1]
    for suffix in _DATA_FILE_SUFFIXES:
        if base.endswith(suffix):
            stem = base[: -len(suffix)]
            break
    else:
        raise ValueError(f"{filename!r} is not an index or event file name (expected .json, .csv or .tfevents)")
    step_text, sep, worker = stem.partition("_")
    if not sep or not worker or not _STEP_DIGITS.fullmatch(step_text):
        raise ValueError(f"{filename!r} does not match '<step digits>_<worker>{suffix}'")
    step = int(step_text)
    if step >= MAX_STEP_EXCLUSIVE:
        raise ValueError(f"{filename!r}: step {step} is not below {MAX_STEP_EXCLUSIVE}")
    return step, worker


def parse_collections_worker(filename):
    """Worker name of a collections file: the text before ``_collections.json``."""
    base = str(filename).replace("\\", "/").rsplit("/", 1)[-1]
    if not base.endswith(COLLECTIONS_SUFFIX) or len(base) == len(COLLECTIONS_SUFFIX):
        raise ValueError(f"{filename!r} is not a '<worker>{COLLECTIONS_SUFFIX}' file name")
    return base[: -len(COLLECTIONS_SUFFIX)]


def serialize_worker_name(device_str):
    """TensorFlow MirroredStrategy device -> worker name: ``/`` -> ``_``, ``:`` -> ``-``.

    ``/job:worker/replica:0/task:0/device:GPU:0`` -> ``_job-worker_replica-0_task-0_device-GPU-0``.
    """
    if not isinstance(device_str, str) or not device_str:
        raise ValueError(f"device name must be a non-empty string, got {device_str!r}")
    return device_str.replace("/", "_").replace(":", "-")


def deserialize_worker_name(name):
    """Inverse of :func:`serialize_worker_name` (``_`` -> ``/``, ``-`` -> ``:``)."""
    return name.replace("_", "/").replace("-", ":")


def tensorboard_file_relpath(mode, step, pid, hostname):
    """``{MODE}/{step:012d}_{pid}_{hostname}.tfevents``, relative to the TensorBoard directory."""
    mode = ModeKeys.parse(mode)
    s = validate_step(step)
    # A hostname never holds a separator in practice; make sure it cannot escape the directory.
    host = re.sub(r"[^-\w.]", "_", str(hostname)) or "localhost"
    return f"{mode.name}/{s:012d}_{int(pid)}_{host}{EVENT_FILE_SUFFIX}"


def join_under(root, relpath):
    """Join a ``/``-separated relative path from this module onto a local directory."""
    return os.path.join(root, *relpath.split("/"))


def marker_relpath(worker: str) -> str:
    """The flight recorder marker of ``worker``, inside the run directory."""
    return f"{MARKER_DIR}/trigger-{worker}.json"

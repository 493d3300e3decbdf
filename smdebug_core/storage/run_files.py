"""The files a hook keeps beside its steps: preparing the run directory (refusing or, with
``overwrite``, removing an earlier run), the step counters kept across restarts, and
reading the flight recorder's markers.

They are about the run as a whole, not about any one step, so they live apart from the
session's step logic and the step files (``writer/``). Capture writes them; analysis reads them.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..exceptions import OutDirError, SMDebugError
from .format import layout, store
from ..logger import get_logger
from ..modes import ModeKeys

logger = get_logger()

#: What makes a directory a run (docs/format.md 1.1).
RUN_MARKERS = ("collections", "index", "events", store.STORE_DIR, layout.END_OF_JOB_FILE)


def prepare_out_dir(out_dir: str, *, check: bool, overwrite: bool, siblings: List[str], world_size: int,
                    side_files: Tuple[str, ...]) -> None:
    """Make ``out_dir`` ready for this worker's files.

    ``check`` (the chief of a local run): an earlier run there is refused, or removed with
    ``overwrite`` together with its ``side_files`` (what rules leave), but files of this
    job's other workers (``siblings``, with ``include_workers="all"``) are neither
    (writer/siblings.py). Then the directory must exist and be writable: OutDirError if not.
    """
    if check and os.path.isdir(out_dir):
        from .siblings import remove_previous_run, written_by_other_workers

        existing = [m for m in RUN_MARKERS if os.path.exists(os.path.join(out_dir, m))]
        if existing and siblings and written_by_other_workers(out_dir, siblings, world_size):
            existing = []  # this job's other workers started first: keep their files
        if existing and not overwrite:
            raise OutDirError(
                f"out_dir {out_dir} already holds a run ({', '.join(existing)} exist); choose a new "
                "directory, delete it, or pass overwrite=True to replace that run"
            )
        remove_previous_run(out_dir, tuple(existing) + side_files, siblings)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".smdebug_write_test_"):
            pass
    except OSError as exc:
        raise OutDirError(f"out_dir {out_dir} is not writable: {exc.strerror or exc}") from None


class StepCounters:
    """Step counters kept across restarts (spot training): ``metadata.json`` in the checkpoint
    directory (docs/format.md 1.3), so that a job started again continues its numbering."""

    def __init__(self, checkpoint_dir: str):
        self.dir = checkpoint_dir
        self.path = os.path.join(checkpoint_dir, "metadata.json")

    def load(self) -> Optional[Tuple[int, Dict[ModeKeys, int]]]:
        """``(last global step seen, mode -> last mode step)`` of a previous run, or None."""
        try:
            with open(self.path) as fh:
                records = json.load(fh)
            last = records[-1] if isinstance(records, list) and records else None
            if not isinstance(last, dict):
                return None
            seen = int(last["latest-global-step-seen"])
            mode_steps = {ModeKeys.parse(k): int(v) for k, v in (last.get("latest-mode-step") or {}).items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("smdebug: ignoring unreadable step state %s: %s", self.path, exc)
            return None
        return seen, mode_steps

    def save(self, training_run: str, step: int, mode_steps: Dict[ModeKeys, int]) -> None:
        """Write the state atomically (a failure is a warning: training goes on)."""
        record = {
            "training-run": training_run,
            "latest-global-step-saved": step,
            "latest-global-step-seen": step,
            "latest-mode-step": {m.name: s for m, s in mode_steps.items() if s >= 0},
        }
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as fh:
                json.dump([record], fh)
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning("smdebug: could not save step state to %s: %s", self.dir, exc)


def _json_object(raw: bytes, max_bytes: int) -> Dict[str, Any]:
    """A side file's JSON object; ValueError when it is too large or not an object (readers
    never trust a run's files)."""
    if len(raw) > max_bytes:
        raise ValueError(f"{len(raw)} bytes, more than {max_bytes}")
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def read_markers(list_files: Callable[[], List[str]], read_bytes: Callable[[str], bytes],
                 max_bytes: int = 1 << 20) -> Dict[str, Dict[str, Any]]:
    """Markers of a run, by worker: ``list_files()`` gives the relative paths under
    :data:`~.format.layout.MARKER_DIR`, ``read_bytes(relpath)`` their content. A marker that is too large or
    not a JSON object is skipped with a warning (readers never trust a run's files)."""
    out = {}
    for relpath in sorted(list_files()):
        name = relpath.rsplit("/", 1)[-1]
        if not (name.startswith("trigger-") and name.endswith(".json")):
            continue
        try:
            doc = _json_object(read_bytes(relpath), max_bytes)
        except (OSError, ValueError, RecursionError) as exc:
            logger.warning("smdebug: skipping unreadable flight recorder marker %s: %s", relpath, exc)
            continue
        out[name[len("trigger-"):-len(".json")]] = doc
    return out


#: The run's record of its early-stopping mechanism (docs/format.md, "Early stopping").
EARLY_STOPPING_FILE = "early_stopping.json"
_EARLY_STOPPING_KEYS = ("framework", "mechanism", "monitor", "mode", "patience", "best_step", "best_pass",
                        "best_value", "stopped_step", "passes_after_best", "stopped")


def write_early_stopping(out_dir: str, record: Dict[str, Any]) -> None:
    """Write the early-stopping record of a run (atomically: readers see all of it or none)."""
    doc = {key: record.get(key) for key in _EARLY_STOPPING_KEYS}
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".early_stopping.")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, os.path.join(out_dir, EARLY_STOPPING_FILE))


def read_early_stopping(read_bytes: Callable[[str], bytes], max_bytes: int = 1 << 16) -> Optional[Dict[str, Any]]:
    """The early-stopping record of a run, or None (none written, or unreadable: warned)."""
    try:
        doc = _json_object(read_bytes(EARLY_STOPPING_FILE), max_bytes)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, SMDebugError) as exc:
        logger.warning("smdebug: skipping the unreadable %s: %s", EARLY_STOPPING_FILE, exc)
        return None
    return {key: doc.get(key) for key in _EARLY_STOPPING_KEYS}

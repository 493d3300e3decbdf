"""The flight recorder: the last N steps of chosen collections, kept in memory whatever the
save interval, written out when something goes wrong (docs/flight_recorder.md).

Three pieces, all framework-agnostic:

* :class:`FlightRecorder`: what the user configures (``Hook(flight_recorder=...)`` or the
  JSON config's ``HookParameters.flight_recorder``), checked at construction;
* :class:`StepRing`: a bounded ring of finished steps with byte accounting. A step is kept
  as the writer would receive it (host arrays: reductions and the full values the
  collections ask for); the oldest steps are dropped to stay within both ``steps`` and
  ``max_bytes``;
* :class:`Recorder`: the hook's runtime side. It keeps each step that was not saved
  normally, notes the steps that were (never written twice), and on a trigger (a
  non-finite value in a captured tensor, a rule's action, an exception escaping the
  training step, or an explicit call) hands the kept steps to the writer and writes a
  marker, ``<out_dir>/flight_recorder/trigger-<worker>.json``, naming the trigger, the step
  and where the first non-finite value appeared.

The adapter's part (PyTorch: adapters/pytorch/hook.py) is a *probe* per step: an object
whose ``locate()`` names the first module whose output or gradient became non-finite. It is
only called for the step that fired, so a step that fires nothing costs no read of it.
"""
from __future__ import annotations

import functools
import json
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..flight_recorder_config import FlightRecorder
from ..logger import get_logger
from ..reductions import NAN_WHEN_UNDEFINED
from ..storage.format.layout import marker_relpath
from ..storage.step_data import records_nbytes

logger = get_logger()

#: Bytes counted per record besides its array data (name, tuple, numpy scalar object):
#: a step of reductions is hundreds of small records, which would otherwise count as nothing.
RECORD_OVERHEAD_BYTES = 128
#: Names of non-finite tensors listed in a marker, at most.
MAX_NAMES_IN_MARKER = 20
TRIGGERS = ("nonfinite", "rule", "exception", "manual")


class StepRing:
    """The most recent steps, at most ``max_steps`` of them and ``max_bytes`` of data.

    Entries are ``(key, item, nbytes)``; ``item`` None marks a step that needs no keeping
    (saved normally): it counts towards ``max_steps`` and holds no bytes. Not thread-safe by
    itself (:class:`Recorder` locks).
    """

    def __init__(self, max_steps: int, max_bytes: int):
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self._entries: Deque[Tuple[Any, Any, int]] = deque()
        #: bytes held now, the most ever held; kept steps dropped as older than the last
        #: ``max_steps``, dropped early to stay within ``max_bytes``; steps too large to keep
        self.bytes_used = 0
        self.peak_bytes = 0
        self.dropped_old = 0
        self.dropped_for_budget = 0
        self.too_large = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key, item, nbytes: int) -> bool:
        """Keep ``item`` as the newest step; returns False if it alone is over the budget
        (then it is not kept, and the steps before it stay)."""
        if item is not None and nbytes > self.max_bytes:
            self.too_large += 1
            return False
        # Make room first: the budget holds at every moment, the peak included.
        while self._entries and (len(self._entries) >= self.max_steps or self.bytes_used + nbytes > self.max_bytes):
            too_many = len(self._entries) >= self.max_steps
            _, old, old_bytes = self._entries.popleft()
            self.bytes_used -= old_bytes
            if old is not None:
                if too_many:
                    self.dropped_old += 1
                else:
                    self.dropped_for_budget += 1
        self._entries.append((key, item, nbytes if item is not None else 0))
        self.bytes_used += nbytes if item is not None else 0
        self.peak_bytes = max(self.peak_bytes, self.bytes_used)
        return True

    def keys(self) -> List[Any]:
        return [key for key, _, _ in self._entries]

    def take(self) -> List[Tuple[Any, Any]]:
        """Every ``(key, item)``, oldest first, emptying the ring."""
        out = [(key, item) for key, item, _ in self._entries]
        self._entries.clear()
        self.bytes_used = 0
        return out


def step_nbytes(tensors: Sequence[Any], shapes: Sequence) -> int:
    """What a step's records hold in memory: array bytes plus a per-record cost (a
    :class:`~smdebug.storage.step_data.ScalarRun` counts as one record: one array)."""
    return RECORD_OVERHEAD_BYTES * (len(tensors) + len(shapes)) + records_nbytes(tensors)


def nonfinite_rows(table: Optional[np.ndarray], keys: Sequence[Tuple[str, bool]]) -> Optional[np.ndarray]:
    """Row indices of a ``[n, len(keys)]`` reductions table whose tensor holds a NaN or an
    infinity; None if none.

    Every plain reduction (min, max, mean, std, variance, sum, prod, median, norms, their abs
    forms) is NaN or infinite when its tensor holds a NaN or an infinity, so the reductions
    already on the host tell, without reading the tensors again: one numpy call per batch.
    (The converse has one exception: a sum of finite values that overflows float64, ~1e308,
    reads as infinite.) The health reductions are NaN where they are undefined (the kurtosis
    of one element, a fraction of no element): of them only the ``nonfinite`` count tells,
    read as a count (:func:`_telling_columns`). A row of NaN for an empty tensor is the
    caller's to skip (``BatchResult.unreduced``).
    """
    if table is None or table.size == 0:
        return None
    propagating, counting = _telling_columns(tuple(keys))
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(table)
        if finite.all():
            return None
        bad = ~finite[:, propagating].all(axis=1)
        if len(counting):
            bad |= (table[:, counting] > 0).any(axis=1)
    return np.flatnonzero(bad) if bad.any() else None


def reductions_nonfinite(reductions: Dict[Tuple[str, bool], Any]) -> bool:
    """:func:`nonfinite_rows` of one tensor's reductions, as a ``{key: value}`` dict."""
    if not reductions:
        return False
    keys = tuple(reductions)
    return nonfinite_rows(np.array([[float(np.asarray(reductions[k]).reshape(-1)[0]) for k in keys]]), keys) is not None


@functools.lru_cache(maxsize=256)  # the same few key tuples at every saved step
def _telling_columns(keys: Tuple[Tuple[str, bool], ...]) -> Tuple[np.ndarray, np.ndarray]:
    """The columns of ``keys`` whose non-finite value says the tensor holds one (the plain
    reductions), and those that count non-finite elements (``nonfinite``)."""
    propagating = [j for j, (op, _) in enumerate(keys) if op not in NAN_WHEN_UNDEFINED]
    counting = [j for j, (op, _) in enumerate(keys) if op == "nonfinite"]
    return np.array(propagating, dtype=np.intp), np.array(counting, dtype=np.intp)


def value_is_nonfinite(value) -> bool:
    """Whether a host array (a raw value or one reduction) holds a NaN or an infinity."""
    array = np.asarray(value)
    # bfloat16 (ml_dtypes) reports kind "V" but answers isfinite like any float
    if array.size == 0 or not (array.dtype.kind in "fc" or array.dtype.name == "bfloat16"):
        return False
    with np.errstate(invalid="ignore"):
        return not bool(np.isfinite(array).all())


class Recorder:
    """The hook's flight recorder at run time (one per hook that writes files).

    ``keep`` and ``keep_saved`` are called once per step, in step order, on whichever thread
    finishes steps (the step pipeline's worker or the training thread); ``fire`` from that
    thread (a non-finite value) or another (an exception, a rule's action). One lock makes
    them safe together; the thread finishing a kept step holds it (:attr:`lock`) from
    keeping the step until its scalars are handed to the writer, so a fire from another
    thread never writes the whole step between the two (which would file its scalars twice). It fires once: the steps before the first trigger are what explains
    it, and after a NaN every later step is usually NaN too. ``submit(step_data)`` and
    ``write_file(relpath, bytes)`` are the writer's; any failure disables the recorder
    (one warning), never the hook or training.
    """

    def __init__(self, config: FlightRecorder, worker: str, submit: Callable, write_file: Callable):
        self.config = config
        self.worker = worker
        self.ring = StepRing(config.steps, config.max_bytes)
        self._submit = submit
        self._write_file = write_file
        # Re-entrant: a step's finisher fires (NaN) while holding it across keep and submit.
        self._lock = threading.RLock()
        self.enabled = True
        #: the marker written (a dict) once the recorder fired, else None
        self.fired: Optional[Dict[str, Any]] = None
        self._warned_too_large = False

    @property
    def lock(self) -> threading.RLock:
        """Held by the thread finishing a step across keep, fire and the scalars' submit."""
        return self._lock

    def disable(self, reason: str) -> None:
        """Stop keeping steps after a failure (one warning); the hook saves as configured."""
        with self._lock:
            if self.enabled:
                self.enabled = False
                self.ring.take()
                logger.warning("smdebug flight recorder disabled after an internal error (%s); the hook goes on "
                               "saving as configured", reason)

    def close(self) -> None:
        """The run is ending: a dump in flight on another thread finishes first (the lock),
        later ones find nothing to write into and return None."""
        with self._lock:
            self.enabled = False
            self.ring.take()

    def keep(self, identity: Tuple, step_data, nbytes: int, probe=None) -> None:
        """Keep a step that was not saved normally (``step_data``: a writer StepData)."""
        with self._lock:
            if not self.enabled or self.fired is not None:
                return
            if not self.ring.add(identity[0], (identity, step_data, probe), nbytes) and not self._warned_too_large:
                self._warned_too_large = True
                logger.warning("smdebug flight recorder: step %d holds %d bytes, more than max_bytes=%d; it is not "
                               "kept (neither are later steps that large). Raise max_bytes or keep fewer "
                               "collections (or their reductions only)", identity[0], nbytes, self.config.max_bytes)

    def keep_saved(self, identity: Tuple, probe=None) -> None:
        """Note a step saved normally: it counts as a recent step, and is not written again."""
        with self._lock:
            if self.enabled and self.fired is None:
                self.ring.add(identity[0], (identity, None, probe), 0)

    def fire(self, trigger: str, reason: str, identity: Optional[Tuple], nonfinite: Sequence[str] = (),
             probe=None) -> Optional[Dict[str, Any]]:
        """Write the kept steps and the marker. Returns the marker's content, or None if the
        recorder already fired or is disabled. ``identity``: (global step, mode, mode step)
        of the step the trigger belongs to; ``probe``: that step's adapter probe, asked where
        the first non-finite value appeared."""
        with self._lock:
            if not self.enabled or self.fired is not None:
                return None
            try:
                return self._fire(trigger, reason, identity, nonfinite, probe)
            except Exception as exc:  # noqa: BLE001 - the recorder is the failing part, not training
                self.enabled = False
                logger.warning("smdebug flight recorder disabled after an internal error while writing its steps "
                               "(%s: %s); the hook goes on saving as configured", type(exc).__name__, exc)
                return None

    def add_location(self, global_step: int, where: Dict[str, Any]) -> None:
        """Name where the first non-finite value appeared in a marker already written for
        ``global_step`` without it (found by an adapter's own check after the fire)."""
        with self._lock:
            marker = self.fired
            if marker is None or marker.get("first_nonfinite") or marker.get("global_step") != global_step:
                return
            marker["first_nonfinite"] = where
            try:
                self._write_file(marker_relpath(self.worker), json.dumps(marker, indent=1).encode())
            except Exception as exc:  # noqa: BLE001 - the marker already written stands
                logger.warning("smdebug flight recorder: could not add the location to its marker (%s)", exc)

    def _fire(self, trigger, reason, identity, nonfinite, probe) -> Dict[str, Any]:
        kept = self.ring.take()
        written, already_saved = [], []
        if probe is None and identity is not None:  # the probe of the trigger's step, if that step was kept
            probe = next((p for _, (ident, _, p) in kept if ident[0] == identity[0]), None)
        for _, (ident, step_data, _) in kept:
            if step_data is None:
                already_saved.append(ident[0])
                continue
            step_data.replace = True  # its scalars (if any) were published alone: the whole step replaces them
            self._submit(step_data)
            written.append(ident[0])
        origin = None
        if probe is not None:
            try:
                origin = probe.locate()
            except Exception as exc:  # noqa: BLE001 - the marker is still written, without the location
                logger.warning("smdebug flight recorder: could not locate the first non-finite value (%s: %s)",
                               type(exc).__name__, exc)
        step, mode, mode_step = identity if identity is not None else (None, None, None)
        marker = {
            "trigger": trigger,
            "reason": reason,
            "global_step": step,
            "mode": getattr(mode, "name", mode),
            "mode_step": mode_step,
            "worker": self.worker,
            "first_nonfinite": origin,
            "nonfinite_tensors": list(nonfinite[:MAX_NAMES_IN_MARKER]),
            "steps_written": written,
            "steps_already_saved": already_saved,
            "steps_kept": self.config.steps,
            "steps_dropped_for_budget": self.ring.dropped_for_budget,
            "steps_too_large": self.ring.too_large,
            "max_bytes": self.config.max_bytes,
            "peak_bytes": self.ring.peak_bytes,
            "collections": list(self.config.collections),
            "time": time.time(),
        }
        self._write_file(marker_relpath(self.worker), json.dumps(marker, indent=1).encode())
        self.fired = marker
        where = ""
        if origin:
            where = f"; first non-finite value: {origin.get('phase')} of {origin.get('module')}"
        logger.warning("smdebug flight recorder fired (%s at step %s: %s): wrote steps %s%s; see %s", trigger, step,
                       reason, written, where, marker_relpath(self.worker))
        return marker


# --- an exception escaping the training loop (sys.excepthook) --------------------------------
_watched: "weakref.WeakSet" = weakref.WeakSet()
_previous_excepthook = None


def watch_uncaught_exceptions(hook) -> None:
    """Call ``hook._on_uncaught_exception(exc)`` when the process is about to end with an
    uncaught exception (chained before the excepthook that was installed: the traceback is
    still printed). Hooks are held weakly; installed once per process."""
    global _previous_excepthook
    _watched.add(hook)
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _on_uncaught


def _on_uncaught(kind, exc, tb):
    for hook in list(_watched):
        try:
            hook._on_uncaught_exception(exc)
        except Exception as error:  # noqa: BLE001 - the user's traceback must still be printed
            logger.warning("smdebug flight recorder: could not write its steps on exit: %s", error)
    (_previous_excepthook or sys.__excepthook__)(kind, exc, tb)

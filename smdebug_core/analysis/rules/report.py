"""The JSON report every rule evaluation keeps, and where it is written.

Where it goes: :func:`~smdebug.rules.invoke_rule` and the ``smdebug-rules`` command write
a file only when asked (``report_path=``, ``--report DIR``): reading a run writes nothing into
it. Live rules (``hook.add_rule``), part of the training run, write to the hook's ``out_dir``:
``<out_dir>/rule_reports/<rule name>.json`` (:func:`default_report_path`; a worker other than
``worker_0`` appends ``_<worker>``) unless given another ``report_path``. The file is
rewritten atomically while the rule runs (at most once a second, and at once after a
violation) and a last time when evaluation ends.

Schema (version 1)::

    {
      "schema": 1,
      "rule": "VanishingGradient",            # the rule's name
      "rule_class": "smdebug.analysis.rules.builtin_tensors.VanishingGradient",
      "parameters": {"threshold": 1e-07},
      "run": "/path/to/run",                  # what the rule read
      "live": false,                          # evaluated inside the training process?
      "status": "running" | "finished",
      "triggered": 2,                         # how many steps the condition held at
      "violations": [                         # the first 1000 of them
        {"step": 12, "mode": "TRAIN", "mode_step": 12, "time": 1700000000.0,
         "message": "...", "details": {...}}
      ],
      "violations_truncated": false,
      "first_violation_step": 12, "last_violation_step": 30,
      "worst": {"step": 14, "measure": 0.5, "message": "..."},   # by the rule's measure, or null
      "datapoints": 40,                       # steps evaluated
      "first_step": 0, "last_step": 39,       # global steps evaluated
      "tensors_unavailable": 0,               # tensor lookups that found no usable data
      "steps_without_data": 0,                # steps where the rule had nothing to read
      "steps_without_data_by_mode": {"EVAL": 0},
      "actions": [{"step": 12, "action": "StopTraining", "result": "..."}],
      "errors": [],                           # messages of failures inside the rule
      "notices": [],                          # e.g. "no tensor in the 'gradients' collection"
      "handled": [{"step": 25, "message": "..."}],  # held, but the run dealt with it (early stopping)
      "handled_count": 1,
      "started": 1700000000.0, "updated": 1700000001.0
    }
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

from ...logger import get_logger

logger = get_logger("smdebug.rules")

REPORT_DIR = "rule_reports"
MAX_VIOLATIONS_KEPT = 1000
MAX_ERRORS_KEPT = 20
#: A summary line quotes at most this much of a firing's message (the rest: --verbose, --report).
_MESSAGE_CHARS = 160
_WRITE_EVERY_S = 1.0


def default_report_path(run_dir: str, rule_name: str, worker: Optional[str] = None) -> str:
    """``<run_dir>/rule_reports/<rule_name>.json`` (``_<worker>`` added for workers other than worker_0)."""
    suffix = "" if worker in (None, "worker_0") else f"_{worker}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rule_name)
    return os.path.join(run_dir, REPORT_DIR, f"{safe}{suffix}.json")


def to_jsonable(value: Any) -> Any:
    """Parameters and details as JSON: numpy scalars/arrays unwrapped, NaN/inf as strings."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    name = getattr(value, "name", None)  # enums (ModeKeys), trials, collections
    if isinstance(name, str):
        return name
    return repr(value)


class RuleReport:
    """What one rule found; thread-safe (a live rule updates it from its evaluation thread)."""

    def __init__(self, rule_name: str, rule_class: str, parameters: Dict[str, Any], run: Optional[str],
                 path: Optional[str], live: bool = False):
        self.rule_name = rule_name
        self.path = path
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._write_failed = False
        self._doc: Dict[str, Any] = {
            "schema": 1, "rule": rule_name, "rule_class": rule_class, "parameters": to_jsonable(parameters),
            "run": run, "live": live, "status": "running", "triggered": 0, "violations": [],
            "violations_truncated": False, "first_violation_step": None, "last_violation_step": None,
            "worst": None, "datapoints": 0, "first_step": None, "last_step": None,
            "tensors_unavailable": 0, "steps_without_data": 0, "steps_without_data_by_mode": {}, "actions": [], "errors": [], "notices": [],
            "handled": [], "handled_count": 0,
            "started": time.time(), "updated": time.time(),
        }

    def __repr__(self):
        with self._lock:
            doc = json.loads(json.dumps(self._doc))
        return f"<RuleReport {self.rule_name} ({doc['status']}): {summary_line(None, doc)}>"

    # --- updates ------------------------------------------------------------------------
    def datapoint(self, step: int) -> None:
        with self._lock:
            doc = self._doc
            doc["datapoints"] += 1
            _extend(doc, "first_step", "last_step", step)
        self.write()

    def violation(self, step: int, mode, mode_step: Optional[int], message: str, details: Dict[str, Any],
                  measure: Optional[float] = None, worst: str = "max") -> dict:
        entry = {"step": step, "mode": to_jsonable(mode), "mode_step": mode_step, "time": time.time(),
                 "message": message, "details": to_jsonable(details)}
        if measure is not None:
            entry["measure"] = to_jsonable(measure)
        with self._lock:
            doc = self._doc
            doc["triggered"] += 1
            _extend(doc, "first_violation_step", "last_violation_step", step)
            current = doc["worst"]
            if current is None or (measure is not None and (
                    current["measure"] is None or
                    (measure < current["measure"] if worst == "min" else measure > current["measure"]))):
                doc["worst"] = {"step": step, "measure": measure, "message": message}
            if len(doc["violations"]) < MAX_VIOLATIONS_KEPT:
                doc["violations"].append(entry)
            else:
                doc["violations_truncated"] = True
        self.write(force=True)
        return entry

    def unavailable(self, count: int = 1) -> None:
        with self._lock:
            self._doc["tensors_unavailable"] += count

    def no_data(self, mode=None) -> None:
        with self._lock:
            self._doc["steps_without_data"] += 1
            if mode is not None:
                by_mode = self._doc["steps_without_data_by_mode"]
                key = to_jsonable(mode)
                by_mode[key] = by_mode.get(key, 0) + 1

    def action(self, step: int, action: str, result: str) -> None:
        with self._lock:
            actions = self._doc["actions"]
            if len(actions) < MAX_VIOLATIONS_KEPT:
                actions.append({"step": step, "action": action, "result": result})

    def error(self, message: str) -> None:
        with self._lock:
            if len(self._doc["errors"]) < MAX_ERRORS_KEPT:
                self._doc["errors"].append(message)
        self.write(force=True)

    def notice(self, message: str) -> None:
        with self._lock:
            if len(self._doc["notices"]) < MAX_ERRORS_KEPT:
                self._doc["notices"].append(message)

    def handled(self, step: int, message: str) -> None:
        """A condition that held but that the run had dealt with (early stopping), not a firing."""
        with self._lock:
            self._doc["handled_count"] += 1
            if len(self._doc["handled"]) < MAX_ERRORS_KEPT:
                self._doc["handled"].append({"step": step, "message": message})

    def finish(self) -> None:
        with self._lock:
            self._doc["status"] = "finished"
        self.write(force=True)

    # --- reading ------------------------------------------------------------------------
    @property
    def triggered(self) -> int:
        return self._doc["triggered"]

    @property
    def datapoints(self) -> int:
        return self._doc["datapoints"]

    @property
    def violation_steps(self) -> List[int]:
        """Global steps at which the rule fired (the first 1000)."""
        with self._lock:
            return [v["step"] for v in self._doc["violations"]]

    def to_dict(self) -> Dict[str, Any]:
        """A copy of the report as a JSON-ready dict."""
        with self._lock:
            return json.loads(json.dumps(self._doc))

    # --- writing ------------------------------------------------------------------------
    def write(self, force: bool = False) -> None:
        """Rewrite the report file (atomically); throttled unless ``force``. Never raises."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last_write < _WRITE_EVERY_S:
            return
        with self._lock:
            self._last_write = now
            self._doc["updated"] = time.time()
            text = json.dumps(self._doc, indent=1)
        directory = os.path.dirname(self.path) or "."
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".report.", suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except OSError as exc:
            if tmp is not None and os.path.exists(tmp):
                try:
                    os.remove(tmp)
                except OSError:
                    pass
            if not self._write_failed:
                self._write_failed = True
                logger.warning("smdebug: cannot write the report of rule %s to %s (%s); it is kept in memory "
                               "(rule.report)", self.rule_name, self.path, exc.strerror or exc)


def _shorten(text: str, limit: int = _MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def summary_line(rule, report: dict) -> str:
    """One line saying what ``rule`` found: where it fired and the worst firing, or how much
    of the run it could evaluate and why not the rest."""
    evaluated, without = report["datapoints"], report["steps_without_data"]
    total = evaluated + without
    if report["triggered"]:
        line = (f"FIRED at {report['triggered']} of {evaluated} evaluated steps (first {report['first_violation_step']}"
                f", last {report['last_violation_step']})")
        worst = report.get("worst")
        if worst:
            measure = worst.get("measure")
            label = getattr(rule, "measure_name", "") or "measure"
            what = f"{label} {measure:.4g} " if isinstance(measure, (int, float)) else ""
            line += f"; worst {what}at step {worst['step']}: {_shorten(worst['message'])}"
        return line + _errors_clause(report)
    line = f"did not fire: {evaluated} of {total} steps evaluated" + (", all fine" if evaluated else "")
    if without:
        modes = ", ".join(f"{n} {m}" for m, n in sorted(report.get("steps_without_data_by_mode", {}).items()))
        line += f"; {without} steps had nothing to read" + (f" ({modes})" if modes else "")
        if report["notices"]:
            line += f": {_shorten(report['notices'][0], 100)}"
    elif report["notices"]:
        line += f" ({_shorten(report['notices'][0], 100)})"
    if report["tensors_unavailable"]:
        line += f"; {report['tensors_unavailable']} tensor reads found no data"
    handled = report.get("handled") or []
    if handled:
        line += f"; {_shorten(handled[0]['message'].rpartition('; ')[2], 120)} (at step {handled[0]['step']})"
    return line + _errors_clause(report)


def culprit_line(report: dict) -> str:
    """Where the first firing's condition started: its layer, tensor and first step ("" if unnamed)."""
    violations = report.get("violations") or []
    if not violations:
        return ""
    found = (violations[0].get("details") or {}).get("culprit")
    if not isinstance(found, dict):
        return ""
    text = f"layer {found.get('layer')} ({found.get('tensor')}), from step {found.get('first_step')}"
    if found.get("why"):
        text += f": {found['why']}"
    return text


def _errors_clause(report: dict) -> str:
    """What the summary says of steps skipped because their files could not be read."""
    errors = report.get("errors") or []
    unreadable = [e for e in errors if e.startswith("step ") and " skipped: " in e]
    if not unreadable:
        return ""
    count = f"{len(unreadable)}{'+' if len(errors) >= MAX_ERRORS_KEPT else ''}"
    return f"; {count} step{'' if count == '1' else 's'} skipped, unreadable (first: {_shorten(unreadable[0], 100)})"


def _extend(doc: dict, first: str, last: str, step: int) -> None:
    """The range ``doc[first]``..``doc[last]`` now reaches ``step`` (steps come in order)."""
    if doc[first] is None:
        doc[first] = step
    doc[last] = step

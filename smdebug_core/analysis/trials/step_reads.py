"""Many tensors of one step read together: what the rules' :class:`TrialStepView` fetches
before a step's rules run (one read per event or chunk file, each record decoded once)."""
from __future__ import annotations

from typing import Dict, List, Mapping, Set, Tuple

import numpy as np

from .locations import ReadRequest
from .tensor import Tensor

VALUE = "value"
SAVED_REDUCTIONS = "saved_reductions"
ReductionKey = Tuple[str, bool]


class StepReads:
    """What :func:`read_step` read: ``values`` (name -> array), ``saved`` (name -> every saved
    reduction, ``{key: array}``), ``reductions`` (name -> the saved reductions asked for),
    ``from_value`` (``(name, key)`` asked for that only a value holds: compute them from
    ``values``), ``no_value`` (names asked for whose value the step does not have) and
    ``records`` (how many records were read)."""

    def __init__(self):
        self.values: Dict[str, np.ndarray] = {}
        self.saved: Dict[str, Dict[ReductionKey, np.ndarray]] = {}
        self.reductions: Dict[str, Dict[ReductionKey, np.ndarray]] = {}
        self.from_value: List[Tuple[str, ReductionKey]] = []
        self.no_value: Set[str] = set()
        self.records = 0


def read_step(trial, step: int, needs: Mapping[str, object]) -> StepReads:
    """Read what ``needs`` asks of each tensor at global ``step``. A need has ``value`` (the
    value), ``reductions`` (keys: saved, else from the value), ``saved`` (every saved
    reduction) and ``first_of`` (the first of ``"value"`` / ``"saved_reductions"`` saved)."""
    out = StepReads()
    requests = []
    reader = None
    for name, need in needs.items():
        tensor = trial.tensor(name) if trial.has_tensor(name) else None
        if tensor is None:
            continue
        reader = reader or tensor
        raw_worker, raw_loc = Tensor._pick(tensor._locations.get(step), None)
        by_worker = tensor._reductions.get(step) or {}
        saved_worker, saved = Tensor._pick({w: r for w, r in by_worker.items() if r}, None)
        want_value, want_saved = need.value, need.saved
        for kind in need.first_of:
            if kind == VALUE and raw_loc is not None:
                want_value = True
                break
            if kind == SAVED_REDUCTIONS and saved:
                want_saved = True
                break
        if want_saved:
            out.saved[name] = {}
            for key, loc in (saved or {}).items():
                requests.append(ReadRequest(("saved", name, key), loc, step, saved_worker))
        for key in sorted(need.reductions):
            if want_saved and saved and key in saved:
                continue
            holder = next((w for w in sorted(by_worker) if key in by_worker[w]), None)
            if holder is not None:
                requests.append(ReadRequest(("red", name, key), by_worker[holder][key], step, holder))
            elif raw_loc is not None:
                want_value = True
                out.from_value.append((name, key))
        if want_value:
            if raw_loc is not None:
                requests.append(ReadRequest(("value", name, None), raw_loc, step, raw_worker))
            else:
                out.no_value.add(name)
    if not requests:
        return out
    read = reader._read(requests, progress=False)
    out.records = len(requests)
    for (kind, name, key), value in read.items():
        if kind == "value":
            out.values[name] = value
        elif kind == "saved":
            out.saved[name][key] = value
        else:
            out.reductions.setdefault(name, {})[key] = value
    return out

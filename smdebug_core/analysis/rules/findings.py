"""How the tensor rules report what they find (one note per finding, the culprit where it
started) and read values they can compute with; shared by the rules over tensors."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from ...modes import ModeKeys
from .rule import DATA_MISSING

MAX_LISTED = 5
MAX_DETAILS = 20
TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)


def listing(items: Dict[str, object], fmt="{:.3g}") -> str:
    shown = []
    for name, value in list(items.items())[:MAX_LISTED]:
        shown.append(f"{name}={fmt.format(value) if isinstance(value, (int, float)) else value}")
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def details(items: Dict[str, object]) -> Dict[str, object]:
    return dict(list(items.items())[:MAX_DETAILS])


def note_found(rule, finding: str, noun: str, found: Dict[str, object], key: str, fmt: str = "{:.3g}") -> bool:
    """One note: ``finding`` in how many ``noun``s, which (with their values under ``key``); whether any."""
    if found:
        rule.note(f"{finding} in {count(len(found), noun)}: {listing(found, fmt)}", **{key: details(found)})
    return bool(found)


def earliest(rule, found: Dict[str, object]) -> str:
    """Of the tensors where a condition holds, the one where it started first (earliest
    streak), the first in the run's model order among those."""
    order = rule.view.model_order()
    return min(found, key=lambda n: (rule.streak_start(n, True), order.key(n)))


def numeric(array: np.ndarray) -> Optional[np.ndarray]:
    """The array as a float/complex/int numpy array, or None for strings and other non-numbers."""
    array = np.asarray(array)
    if array.dtype.kind in "biufc":
        return array
    try:  # ml_dtypes (bfloat16, float8) register as kind "V"
        return array.astype(np.float32)
    except (TypeError, ValueError):
        return None


def numeric_values(rule, names):
    """``(name, array)`` of the names whose value at the rule's step is a non-empty numeric
    array; a value the step cannot supply is counted as unavailable in the rule's report."""
    for name in names:
        try:
            array = numeric(rule.view.value(name))
        except DATA_MISSING:
            rule.unavailable()
            continue
        if array is not None and array.size:
            yield name, array

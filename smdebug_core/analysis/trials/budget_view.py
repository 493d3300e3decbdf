"""What a hook's overhead budget did, read back from the scalars it recorded at each decision
step (smdebug_core/capture/budget.py): the budget, the measured cost and each expensive
collection's effective save interval, with the steps where it changed. ``Trial.overhead_budget()``,
``smdebug ls`` and the report's summary show it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

#: The recorded scalars' names in a trial (``save_scalar`` names are read as ``scalar/<name>``).
PREFIX = "scalar/overhead_budget/"


def _all_series(trial, names: List[str]) -> Dict[str, List[Tuple[int, float]]]:
    """``(step, value)`` of each scalar, read in one call; worker_0's where several workers
    saved it (the ranks agree)."""
    table = trial.to_table(names, progress=False)
    return {tensor: list(zip(steps.tolist(), values.tolist()))
            for (tensor, label), (steps, values, _) in table.series().items() if label == ""}


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.3g}%"


def overhead_budget(trial) -> Optional[Dict[str, object]]:
    """``budget`` (a fraction), ``measured`` (``[(step, fraction)]``, the ranks' maximum at each
    decision), ``intervals`` (collection -> ``[(from step, every n mode steps)]``, its changes)
    and ``text``, one line for people; None when the run had no budget."""
    names = [n for n in trial.tensor_names() if n.startswith(PREFIX)]
    if PREFIX + "budget" not in names:
        return None
    series = _all_series(trial, names)
    if not series.get(PREFIX + "budget"):
        return None
    budget = series[PREFIX + "budget"][-1][1]
    measured = series.get(PREFIX + "measured", [])
    intervals: Dict[str, List[Tuple[int, int]]] = {}
    for name in sorted(n for n in names if n.startswith(PREFIX + "every/")):
        changes: List[Tuple[int, int]] = []
        for step, every in series.get(name, []):
            if not changes or changes[-1][1] != int(every):
                changes.append((step, int(every)))
        intervals[name[len(PREFIX + "every/"):]] = changes
    parts = [f"{coll}: every {changes[-1][1]} steps from step {changes[-1][0]:,}"
             for coll, changes in intervals.items() if changes]
    parts.append(f"budget {_percent(budget)}, measured {_percent(measured[-1][1]) if measured else 'nothing yet'}")
    return {"budget": budget, "measured": measured, "intervals": intervals, "text": "; ".join(parts)}

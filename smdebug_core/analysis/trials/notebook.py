"""What a Trial shows people: its summary, and Jupyter's view of it (a summary table beside a
loss sparkline and a small heatmap of the gradients' L2 norms; ``smdebug report`` shows the
whole run)."""
from __future__ import annotations

import html
import logging
from typing import Dict


from ...exceptions import CorruptCollectionsFile
from ...modes import ModeKeys

logger = logging.getLogger("smdebug")

#: The most gradients in a trial's notebook heatmap.
NOTEBOOK_ROWS = 200


def summary(trial) -> Dict[str, object]:
    """See :meth:`Trial.summary`."""
    trial._maybe_refresh()
    modes = {}
    to_mode = trial._steps.global_to_mode
    for mode in trial.modes():
        steps = trial._steps.sorted_steps(mode)
        modes[mode.name] = (len(steps), steps[0], steps[-1]) if steps else (0, None, None)
    if ModeKeys.GLOBAL in {m for m, _ in to_mode.values()}:
        steps = sorted(g for g, (m, _) in to_mode.items() if m is ModeKeys.GLOBAL)
        modes["GLOBAL"] = (len(steps), steps[0], steps[-1])
    names = list(trial._index.tensors)[:2000]  # enough to name the collections in use
    used = []
    for cname, coll in sorted(trial.collections().items()):
        try:
            if any(coll.matches(n) for n in names):
                used.append(cname)
        except CorruptCollectionsFile:  # a regex refused for safety: listed as unknown
            used.append(f"{cname} (regex refused)")
    return {"name": trial.name, "path": trial.path, "ended": trial.loaded_all_steps,
            "workers": sorted(trial._workers), "steps": len(to_mode), "modes": modes,
            "tensors": len(trial._index.tensors), "collections": used}


def notebook_html(trial) -> str:
    """See :meth:`Trial._repr_html_`."""
    info = summary(trial)
    rows = [("path", info["path"]), ("state", "ended" if info["ended"] else "training (or not ended)"),
            ("workers", ", ".join(info["workers"]) or "none"), ("saved steps", str(info["steps"])),
            ("tensors", str(info["tensors"])), ("collections", ", ".join(info["collections"]) or "none")]
    for mode, (count, first, last) in info["modes"].items():
        rows.append((f"{mode} steps", f"{count} ({first} to {last})" if count else "0"))
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                   f"{html.escape(v)}</td></tr>" for k, v in rows)
    table = f"<table>{body}</table>"
    try:
        pictures = _pictures(trial)
    except ImportError:  # no matplotlib: the table alone
        pictures = ""
    except Exception as exc:  # noqa: BLE001 - a notebook's display of a trial never raises
        logger.debug("smdebug: no pictures in the trial's notebook view: %s", exc)
        pictures = ""
    return (f"<div><strong>smdebug Trial {html.escape(info['name'])}</strong><div style='display:flex;"
            f"gap:1em;align-items:flex-start'>{table}<div>{pictures}</div></div></div>")


def _pictures(trial) -> str:
    from ..heatmaps import small_heatmap, sparkline

    names = trial.tensor_names()
    losses_coll = trial.collections().get("losses")
    losses = [n for n in names if losses_coll is not None and losses_coll.matches(n)] or \
        [n for n in names if "loss" in n.lower() and "/" not in n]
    gradients = [n for n in names if n.startswith("gradient/") or n.startswith("gradients/")][:NOTEBOOK_ROWS]
    if not losses and not gradients:
        return ""
    series = trial.to_table(losses[:1] + gradients, reductions=["l2"], progress=False).series()
    out = []
    if losses and (losses[0], "") in series:
        steps, values, modes = series[(losses[0], "")]
        train = modes == "TRAIN"
        if train.any():  # else no TRAIN mode (XGBoost rounds): every step
            steps, values = steps[train], values[train]
        out.append(f"<img alt='loss' src='{sparkline(steps, values, losses[0])}'>")
    rows = [(name, *series[(name, "l2")][:2]) for name in gradients if (name, "l2") in series]
    if rows:
        out.append(f"<br><img alt='gradient L2 norms' src='{small_heatmap(rows, 'gradient l2')}'>")
    return "".join(out)




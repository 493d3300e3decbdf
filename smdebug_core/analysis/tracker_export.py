"""``smdebug export RUN --to wandb|mlflow``: a finished run's scalars and reductions sent to W&B or
MLflow as the hook's sinks send them live (:mod:`smdebug.trackers`), read through the public
Trial API (``Trial.to_table``).

A series longer than ``max_points`` is downsampled: its steps cut into ``max_points // 2``
bins, each keeping its minimum and maximum (and its first NaN/Inf), so a spike is never
averaged away. For W&B, whose per-layer values go as one table (or histogram) per statistic
and step, the steps of a statistic are chosen the same way from the smallest and the largest
value over its tensors at each step; for MLflow each per-layer series is downsampled alone.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from ..trackers import StepPoints, extreme_bins, make_destination

#: Points per series at most, by default.
MAX_POINTS = 1000


def export_to_tracker(trial, to: str, *, names=None, regex=None, collection=None, mode=None,
                      worker: Optional[str] = None, max_points: int = MAX_POINTS, batch_steps: int = 64,
                      **destination_kwargs) -> dict:
    """Send ``trial``'s values (one worker's: ``worker``, default worker_0 or the first) to a new
    run of ``to`` (or the active one). Returns ``{"steps", "points", "dropped", "worker"}``."""
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2 (a bin keeps its minimum and maximum), got {max_points}")
    destination = make_destination(to, **destination_kwargs)
    table = trial.to_table(names, regex=regex, collection=collection, mode=mode)
    steps, values = table.numbers["step"], table.numbers["value"]
    texts = table.texts
    w_codes, w_cats = texts["worker"]
    if not len(steps):
        return {"steps": 0, "points": 0, "dropped": 0, "worker": None}
    worker = worker or ("worker_0" if "worker_0" in w_cats else sorted(w_cats)[0])
    if worker not in w_cats:
        raise ValueError(f"no values of worker {worker!r} in this selection; its workers: {sorted(w_cats)}")
    rows = np.flatnonzero(np.asarray(w_codes) == w_cats.index(worker))
    (t, t_cats), (r, r_cats), (m, m_cats) = texts["tensor"], texts["reduction"], texts["mode"]
    t, r, m = np.asarray(t)[rows], np.asarray(r)[rows], np.asarray(m)[rows]
    steps, values = steps[rows], values[rows]
    by_step: Dict[Tuple[int, str], StepPoints] = {}

    def point(step, mode_name) -> StepPoints:
        key = (int(step), mode_name)
        found = by_step.get(key)
        if found is None:
            found = by_step[key] = StepPoints(int(step), mode_name)
        return found

    grouped = to == "wandb"
    series: Dict[tuple, np.ndarray] = {}
    order = np.lexsort((steps, t, r, m))
    keys = np.stack([m[order], r[order], t[order]], axis=1)
    cuts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    for part in np.split(order, cuts):
        series[(int(m[part[0]]), int(r[part[0]]), int(t[part[0]]))] = part
    stat_steps: Dict[tuple, set] = {}
    if grouped:  # the steps kept per (mode, statistic): extremes over its tensors
        stat_steps = _grouped_steps(series, steps, values, r_cats, max_points)
    layers: Dict[tuple, tuple] = {}  # (point, statistic) -> (point, tensors, values)
    for (mode_code, red_code, tensor_code), part in series.items():
        mode_name, reduction, tensor = m_cats[mode_code], r_cats[red_code], t_cats[tensor_code]
        if reduction and grouped:
            keep = stat_steps[(mode_code, red_code)]
            chosen = [i for i in part if int(steps[i]) in keep]
        else:
            chosen = part[extreme_bins(steps[part], values[part], max_points)]
        for i in chosen:
            p = point(steps[i], mode_name)
            if reduction:
                names, picked = layers.setdefault((id(p), reduction), (p, [], []))[1:]
                names.append(tensor)
                picked.append(values[i])
            else:
                p.scalars.append((tensor, float(values[i])))
    for (_, reduction), (p, names, picked) in layers.items():
        p.add_stats(reduction, names, picked)
    batch = [by_step[k] for k in sorted(by_step)]
    dropped = 0
    for start in range(0, len(batch), batch_steps):
        dropped += destination.send(batch[start:start + batch_steps])
    destination.close()
    return {"steps": len({k[0] for k in by_step}), "points": sum(len(p) for p in batch) - dropped,
            "dropped": dropped, "worker": worker}


def _grouped_steps(series, steps, values, r_cats, max_points) -> Dict[tuple, set]:
    """(mode, statistic) -> the steps kept: in each bin, the steps of the statistic's smallest
    and largest value over its tensors (all steps when there are few)."""
    groups: Dict[tuple, list] = {}
    for (mode_code, red_code, _), part in series.items():
        if r_cats[red_code]:
            groups.setdefault((mode_code, red_code), []).append(part)
    out = {}
    for key, parts in groups.items():
        rows = np.concatenate(parts)
        uniq, inverse = np.unique(steps[rows], return_inverse=True)
        vals = values[rows]
        low = np.full(len(uniq), np.inf)
        high = np.full(len(uniq), -np.inf)
        bad = np.zeros(len(uniq), bool)
        finite = np.isfinite(vals)
        np.minimum.at(low, inverse[finite], vals[finite])
        np.maximum.at(high, inverse[finite], vals[finite])
        bad[inverse[~finite]] = True
        low[bad & ~np.isfinite(low)] = np.nan  # a step of NaN/Inf only is kept as non-finite
        high[bad] = np.where(np.isfinite(high[bad]), high[bad], np.nan)
        half = max(2, max_points // 2)
        kept = np.union1d(extreme_bins(uniq, low, half), extreme_bins(uniq, high, half))
        kept = np.union1d(kept, np.flatnonzero(bad)[:1]) if bad.any() else kept
        out[key] = {int(s) for s in uniq[kept]}
    return out

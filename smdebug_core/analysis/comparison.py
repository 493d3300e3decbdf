"""Comparing runs: the same values side by side, and the first (step, tensor) where the runs
differ beyond a tolerance. The ``smdebug compare`` command and ``smdebug.analysis.compare``.

    from smdebug.analysis import compare
    result = compare(["/tmp/eager", "/tmp/compiled"], rtol=1e-4)
    result.frame          # one row per (mode, mode step, worker, tensor, reduction), a column per run
    result.divergence     # None, or the first Divergence: step, tensor, both values
    result.only_in        # what some runs saved and the others did not

Rows are matched on (mode, mode step, worker, tensor, reduction): runs whose global steps
differ (one ran an extra evaluation) still line up. ``workers=`` compares one worker of each
run instead (two ranks of one run: ``compare([run, run], workers=["worker_0", "worker_1"])``). The first run is the reference: values
differ when ``|other - reference| > atol + rtol * |reference|`` (numpy's ``isclose``; two NaN
agree). Steps are walked in the first run's global order and, within a step, tensors in the
order they were produced: first the parameters (the first run's ``weights`` and ``biases``
collections: a step saves the values it started from, made by the steps before), then the
others in the order the first run wrote them (their records' offsets in the step's event
file, docs/format.md 3.1). Full tensors (weights, gradients) are compared element
by element too, read one at a time up to the first divergence. Needs pandas.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..exceptions import CorruptCollectionsFile
from ..modes import ModeKeys

__all__ = ["compare", "Comparison", "Divergence", "plot_comparison"]

_KEY = ["mode", "mode_step", "worker", "tensor", "reduction"]
_RESERVED = {"step", "value", *_KEY, "relative_difference", "differs"}


@dataclass(frozen=True)
class Divergence:
    """Where runs first differ beyond the tolerance.

    ``step``: the first run's global step; ``reduction``: ``""`` for the tensor's own value;
    ``element``: the index of the most different element of a full tensor (None for a
    scalar or a reduction); ``values``: run label -> the value there (NaN: a tensor whose
    shapes differ); ``relative_difference``: ``max |a - b| / max(|a|, |b|)`` over the runs
    against the first.
    """

    step: int
    mode: str
    mode_step: int
    worker: str
    tensor: str
    reduction: str
    values: Dict[str, float]
    relative_difference: float
    element: Optional[Tuple[int, ...]] = None
    note: str = ""

    def line(self) -> str:
        """One line: ``first divergence: step <N>, tensor <name>`` then where and the values."""
        what = [f"reduction {self.reduction}"] if self.reduction else []
        if self.element is not None:
            what.append(f"element {list(self.element)}")
        where = f"{self.mode} step {self.mode_step}, {self.worker}"
        values = ", ".join(f"{run} {_number(v)}" for run, v in self.values.items())
        return (f"first divergence: step {self.step}, tensor {self.tensor}"
                f"{' (' + ', '.join(what) + ')' if what else ''} [{where}]: {values}; "
                f"relative difference {_number(self.relative_difference)}"
                f"{'; ' + self.note if self.note else ''}")

    def __str__(self):
        return self.line()


@dataclass
class Comparison:
    """What :func:`compare` found.

    ``frame``: a pandas DataFrame, one row per (mode, mode_step, worker, tensor, reduction)
    that any run saved (scalars and saved reductions, as in ``Trial.to_dataframe``), with
    ``step`` (the first run's global step where it has the row), one value column per run
    (named by its label; NaN where that run lacks the row), ``relative_difference`` and
    ``differs``; rows in walking order. ``divergence``: the first :class:`Divergence`, or
    None. ``only_in``: run label -> ``{"tensors": [...], "steps": [(mode, mode_step)...]}``
    that only some runs have (listed under each run that has them). ``compared``: how many
    scalar rows (``values``) and full tensors (``tensors``) were compared, and how many rows
    only some runs have at steps and of tensors they share (``unmatched``).
    """

    runs: List[str]
    frame: object
    divergence: Optional[Divergence]
    only_in: Dict[str, Dict[str, list]]
    rtol: float
    atol: float
    compared: Dict[str, int] = field(default_factory=dict)
    unmatched_example: str = ""

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    def notes(self) -> List[str]:
        """Lines saying what only some runs saved."""
        lines = []
        for run, only in self.only_in.items():
            for kind in ("tensors", "steps"):
                items = only.get(kind) or []
                if items:
                    shown = [f"{m} {s}" if isinstance(s, int) else str(s) for m, s in items] if kind == "steps" \
                        else list(items)
                    more = f" (and {len(items) - 8} more)" if len(items) > 8 else ""
                    lines.append(f"only in {run}: {len(items)} {kind[:-1] if len(items) == 1 else kind}: "
                                 f"{', '.join(shown[:8])}{more}")
        unmatched = self.compared.get("unmatched", 0)
        if unmatched:
            lines.append(f"not compared: {unmatched} values that only some runs saved at steps they share, "
                         f"as {self.unmatched_example} (saved at other intervals, or other reductions)")
        return lines

    def verdict(self) -> str:
        """The divergence line, or a line saying the runs agree (and on how much)."""
        if self.divergence is not None:
            return self.divergence.line()
        if not self.compared.get("values") and not self.compared.get("tensors"):
            return f"nothing to compare: {', '.join(self.runs)} have no value in common (the 'only in' lines list theirs)"
        return (f"no divergence: {self.compared.get('values', 0)} scalar values and {self.compared.get('tensors', 0)} "
                f"full tensors of {', '.join(self.runs)} agree within rtol={self.rtol:g}, atol={self.atol:g}")

    def __repr__(self):
        return f"<Comparison of {', '.join(self.runs)}: {self.verdict()}>"


def _number(value: float) -> str:
    return f"{value:.9g}"


def _open(trials):
    from .trials import create_trial
    from .trials.trial import Trial

    out = []
    for item in trials:
        out.append(item if isinstance(item, Trial) else create_trial(str(item)))
    return out


def run_labels(trials, workers: Optional[List[str]] = None) -> List[str]:
    """Names for the runs in tables and legends: the run's name, its path where names repeat
    (with ``workers``, one per run: ``name:worker`` where names repeat)."""
    # A run named like a column of the frame ("step", "value"...) gets a suffix.
    names = [f"{t.name} (run)" if t.name in _RESERVED else t.name for t in trials]
    if len(set(names)) == len(names):
        return names
    candidates = [[f"{t.name}:{w}" for t, w in zip(trials, workers)]] if workers else []
    candidates.append([t.path for t in trials])
    for labels in candidates:
        if len(set(labels)) == len(labels):
            return labels
    return [f"{name}#{i + 1}" for i, name in enumerate(names)]


def _one_worker_each(trials, workers) -> Optional[List[str]]:
    if workers is None:
        return None
    workers = [workers] * len(trials) if isinstance(workers, str) else list(workers)
    if len(workers) != len(trials):
        raise ValueError(f"workers: give one worker per run ({len(trials)}), or one for all; got {workers!r}")
    for trial, worker in zip(trials, workers):
        if worker not in trial.workers():
            raise ValueError(f"run {trial.name!r} has no worker {worker!r}; its workers: "
                             f"{', '.join(trial.workers())}")
    return workers


def _selected(trials, names, regex, collection) -> List[List[str]]:
    """The tensors each run has of those selected (every tensor without names/regex/collection)."""
    if names is None and regex is None and collection is None:
        return [t.tensor_names(show_incomplete_steps=True) for t in trials]
    names = [] if names is None else [names] if isinstance(names, str) else list(names)
    for name in names:
        if not any(t.has_tensor(name) for t in trials):
            trials[0].tensor(name)  # raises TensorUnavailable with close names
    collections = None if collection is None else [collection] if isinstance(collection, str) else list(collection)
    for c in collections or ():
        if isinstance(c, str) and not any(c in t.collections() for t in trials):
            known = sorted({name for t in trials for name in t.collections()})
            raise KeyError(f"no collection named {c!r} in any of the runs; known: {', '.join(known) or 'none'}")
    chosen = []
    for t in trials:
        picked = {n for n in names if t.has_tensor(n)}
        # Each run's own collections of those named (one run may lack one).
        own = None if collections is None else [c for c in collections
                                                if not isinstance(c, str) or c in t.collections()]
        if regex is not None or own:
            picked.update(t.tensor_names(collection=own or None, regex=regex, show_incomplete_steps=True))
        chosen.append(sorted(picked))
    return chosen


def _records(trial, names, modes) -> "object":
    """The run's records of ``names`` (its catalog's) as a DataFrame: step, mode, mode_step,
    worker, tensor and reduction."""
    import pandas as pd

    frame = pd.DataFrame(trial.catalog().records(names))
    pairs = {}
    for g in np.unique(frame["step"].to_numpy()).tolist():
        try:
            pairs[g] = trial.mode_modestep(g)
        except Exception:  # noqa: BLE001 - a step outside the trial's steps: its own numbering
            pairs[g] = (ModeKeys.GLOBAL, g)
    frame["mode"] = frame["step"].map({g: m.name for g, (m, _) in pairs.items()}).astype(object)
    frame["mode_step"] = frame["step"].map({g: s for g, (_, s) in pairs.items()}).astype(np.int64)
    if modes is not None:
        frame = frame[frame["mode"].isin({m.name for m in modes})]
    return frame


def _walk_order(trial, names):
    """The order the first run's rows are walked in within a step: ``(tensor position,
    reduction position)`` Series. Tensors in the run's model order (trials/order.py),
    parameters (weights, biases) first; a tensor's value before its reductions, in the order saved."""
    import pandas as pd

    catalog = trial.catalog()
    names = [n for n in names if n in catalog]
    ranked = catalog.order.sorted(names)
    parameters = set(_parameters(trial, ranked))
    tensor_at = pd.Series([float(i) + (0 if n in parameters else _AFTER_PARAMETERS) for i, n in enumerate(ranked)],
                          index=pd.Index(ranked, name="tensor"), name="_tensor_at", dtype=np.float64)
    pairs = [(n, label) for n in ranked for label in ("",) + catalog[n].reductions]
    positions = [float(([""] + list(catalog[n].reductions)).index(label)) for n, label in pairs]
    red_at = pd.Series(positions, index=pd.MultiIndex.from_tuples(pairs, names=["tensor", "reduction"])
                       if pairs else pd.MultiIndex.from_arrays([[], []], names=["tensor", "reduction"]),
                       name="_red_at", dtype=np.float64)
    return tensor_at, red_at


def _relative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.maximum(np.abs(a), np.abs(b))
        rel = np.abs(a - b) / scale
    rel = np.where(scale == 0, 0.0, rel)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & (a == b)
    return np.where(both_nan | same_inf, 0.0, np.where(np.isnan(rel), np.inf, rel))


def compare(trials: Sequence, names=None, *, regex=None, collection=None, mode=None, workers=None,
            rtol: float = 1e-5, atol: float = 1e-8, full_tensors: bool = True,
            progress: Optional[bool] = None) -> Comparison:
    """Compare runs: their shared values side by side and the first divergence.

    Args:
        trials: two or more Trials or run paths; the first is the reference.
        names, regex, collection: the tensors to compare, as for ``Trial.to_dataframe``
            (default: every tensor).
        mode: a mode or list of modes (default: all).
        workers: None (rows matched by worker name), or one worker per run (or one for
            all): each run's rows of that worker, matched whatever the names; the frame's
            ``worker`` column then holds the first run's.
        rtol, atol: the tolerance, as numpy's ``isclose`` with the first run as reference.
        full_tensors: also compare saved full tensors element by element (up to the first
            divergence), not only scalars and saved reductions.
        progress: progress bars on long reads (default: on a terminal).

    Returns a :class:`Comparison`: ``.frame`` (DataFrame), ``.divergence`` (None when the
    runs agree), ``.only_in`` (what only some runs saved).
    """
    from .trials.table import require_pandas

    pd = require_pandas("compare")
    if isinstance(trials, (str, bytes)) or len(trials) < 2:
        raise ValueError(f"compare needs two or more runs (Trials or paths), got {trials!r}")
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"rtol and atol must be numbers of at least 0, got rtol={rtol!r}, atol={atol!r}")
    trials = _open(trials)
    workers = _one_worker_each(trials, workers)
    labels = run_labels(trials, workers)
    modes = None
    if mode is not None:
        parsed = {ModeKeys.parse(m) for m in ([mode] if isinstance(mode, (str, int, ModeKeys)) else mode)}
        modes = None if ModeKeys.GLOBAL in parsed else parsed
    chosen = _selected(trials, names, regex, collection)

    # What only some runs have: tensors, and (mode, mode step) pairs.
    records = [_records(t, sel, modes) for t, sel in zip(trials, chosen)]
    if workers is not None:  # each run's chosen worker, named as the first run's
        records = [r[r["worker"] == w].assign(worker=workers[0]) for r, w in zip(records, workers)]
    tensor_sets = [set(sel) for sel in chosen]
    step_sets = []
    for r in records:
        one_per_step = r.drop_duplicates("step")  # per step, not per record: runs have millions
        step_sets.append(set(zip(one_per_step["mode"].tolist(), one_per_step["mode_step"].tolist())))
    only_in = {}
    for label, tensors, steps in zip(labels, tensor_sets, step_sets):
        only_tensors = sorted(tensors - set.intersection(*tensor_sets))
        only_steps = sorted(steps - set.intersection(*step_sets), key=lambda p: (ModeKeys[p[0]].value, p[1]))
        if only_tensors or only_steps:
            only_in[label] = {"tensors": only_tensors, "steps": only_steps}

    # Scalars and saved reductions, one column per run.
    merged = None
    for i, (t, sel, label) in enumerate(zip(trials, chosen, labels)):
        table = t.to_table(sel, mode=mode, progress=progress,
                           workers=None if workers is None else [workers[i]]) if sel else None
        df = table.to_pandas() if table is not None else pd.DataFrame({k: [] for k in ["step", *_KEY, "value"]})
        df = df.astype({k: str for k in ("mode", "worker", "tensor", "reduction")})
        if workers is not None:
            df["worker"] = workers[0]
        df = df.rename(columns={"value": label, "step": f"_step{i}"})
        df[f"_has{i}"] = True  # a saved NaN is a value; a row the run lacks is not
        merged = df if merged is None else merged.merge(df, on=_KEY, how="outer")
    step_cols = [f"_step{i}" for i in range(len(trials))]
    merged["step"] = merged[step_cols].bfill(axis=1).iloc[:, 0].astype(np.int64) if len(merged) else 0
    # Walking order: the first run's step, then its records' order in that step.
    order, red_order = _walk_order(trials[0], chosen[0])
    merged = merged.join(order, on="tensor").join(red_order, on=["tensor", "reduction"])
    merged = merged.sort_values(["step", "_tensor_at", "tensor", "_red_at", "reduction", "worker"],
                                kind="stable", na_position="last").reset_index(drop=True)
    values = merged[labels].to_numpy(np.float64)
    complete = merged[[f"_has{i}" for i in range(len(trials))]].fillna(False).to_numpy(bool).all(axis=1)
    ref = values[:, :1]
    close = np.isclose(values[:, 1:], ref, rtol=rtol, atol=atol, equal_nan=True).all(axis=1)
    rel = _relative(values[:, 1:], np.broadcast_to(ref, values[:, 1:].shape)).max(axis=1) if len(values) else \
        np.zeros(0)
    merged["relative_difference"] = np.where(complete, rel, np.nan)
    merged["differs"] = complete & ~close
    frame = merged[["step", *_KEY, *labels, "relative_difference", "differs"]]
    compared = {"values": int(complete.sum()), "tensors": 0}
    # Rows some runs lack although they share the tensor and the step (saved at other intervals).
    shared_tensors, shared_steps = set.intersection(*tensor_sets), set.intersection(*step_sets)
    gaps = frame[~complete]
    gaps = gaps[gaps["tensor"].isin(shared_tensors)]
    gaps = gaps[[pair in shared_steps for pair in zip(gaps["mode"].tolist(), gaps["mode_step"].tolist())]]
    compared["unmatched"] = len(gaps)
    example = f"{gaps['tensor'].iloc[0]} at step {int(gaps['step'].iloc[0])}" if len(gaps) else ""

    divergence = None
    hits = np.flatnonzero(frame["differs"].to_numpy())
    if len(hits):
        row = merged.iloc[int(hits[0])]
        divergence = Divergence(int(row["step"]), row["mode"], int(row["mode_step"]), row["worker"], row["tensor"],
                                row["reduction"], {lab: float(row[lab]) for lab in labels},
                                float(row["relative_difference"]))
        limit = (int(row["step"]), _position(row["_tensor_at"]))
    else:
        limit = None
    if full_tensors:
        found = _first_full_divergence(trials, labels, records, order, merged, limit, rtol, atol, compared, workers)
        if found is not None:
            divergence = found
    return Comparison(labels, frame, divergence, only_in, rtol, atol, compared, example)


#: Added to the positions of tensors that are not parameters: they come after them.
_AFTER_PARAMETERS = float(2 ** 50)


def _parameters(trial, names) -> List[str]:
    """The names among ``names`` in the run's weights and biases collections."""
    found = []
    for cname in ("weights", "biases"):
        coll = trial.collections().get(cname)
        if coll is None:
            continue
        for name in names:
            try:
                if coll.matches(name):
                    found.append(name)
            except CorruptCollectionsFile:  # a regex of the run refused for safety: none known by it
                break
    return found


def _position(at) -> float:
    return float("inf") if at != at else float(at)  # NaN: the first run did not write it


def _first_full_divergence(trials, labels, records, order, merged, limit, rtol, atol, compared, workers):
    """The first saved full tensor (not a scalar row) that differs, walking the first run's
    steps and record order up to ``limit`` (the first scalar divergence: (step, position of
    its tensor); the tensor's own value is looked at before its reductions)."""
    keys = None
    for r in records:
        raw = r[r["reduction"] == ""]
        k = set(zip(raw["mode"], raw["mode_step"].tolist(), raw["worker"], raw["tensor"]))
        keys = k if keys is None else keys & k
    scalars = merged[merged["reduction"] == ""]
    keys -= set(zip(scalars["mode"], scalars["mode_step"].tolist(), scalars["worker"], scalars["tensor"]))
    if not keys:
        return None
    first = records[0]
    raw = first[first["reduction"] == ""].join(order, on="tensor")
    walk = sorted((int(g), _position(at), tensor, mode, int(ms), worker)
                  for g, at, tensor, mode, ms, worker in zip(raw["step"], raw["_tensor_at"], raw["tensor"], raw["mode"],
                                                            raw["mode_step"], raw["worker"])
                  if (mode, int(ms), worker, tensor) in keys)
    for g, at, tensor, mode, ms, worker in walk:
        if limit is not None and (g, at) > limit:
            break
        arrays = [t.tensor(tensor).value(ms, mode=mode, worker=worker if workers is None else workers[i])
                  for i, t in enumerate(trials)]
        compared["tensors"] += 1
        found = _array_divergence(arrays, rtol, atol)
        if found is not None:
            element, vals, rel, note = found
            return Divergence(g, mode, ms, worker, tensor, "", dict(zip(labels, vals)), rel, element, note)
    return None


def _array_divergence(arrays, rtol, atol):
    """(element, values there, relative difference, note) where arrays differ most beyond
    the tolerance against the first; None when they agree."""
    ref = np.asarray(arrays[0])
    worst = None
    for other in arrays[1:]:
        other = np.asarray(other)
        if other.shape != ref.shape:
            return None, [float("nan")] * len(arrays), float("inf"), \
                f"shapes differ: {', '.join(str(tuple(np.shape(a))) for a in arrays)}"
        if ref.dtype.kind not in "biuf" or other.dtype.kind not in "biuf":
            if not np.array_equal(ref, other):
                return None, [float("nan")] * len(arrays), float("inf"), "non-numeric values differ"
            continue
        a, b = other.astype(np.float64), ref.astype(np.float64)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            continue
        with np.errstate(invalid="ignore"):
            excess = np.where(close, -np.inf, np.nan_to_num(np.abs(a - b) - atol - rtol * np.abs(b), nan=np.inf))
        flat = int(np.argmax(excess))
        element = tuple(int(i) for i in np.unravel_index(flat, ref.shape)) if ref.ndim else ()
        rel = float(_relative(a.reshape(-1)[flat:flat + 1], b.reshape(-1)[flat:flat + 1])[0])
        if worst is None or rel > worst[2]:
            worst = (element, [float(np.asarray(x, np.float64).reshape(-1)[flat]) for x in arrays], rel, "")
    return worst


def plot_comparison(comparison: Comparison, names=None, reduction: Optional[str] = None, max_panels: int = 12):
    """The compared runs' values over the steps, one panel per (tensor, reduction), one
    colour per run (legend by run); the first divergence, if any, marked. Returns the Figure.

    ``names``: the tensors (default: those with their own scalar values, losses and metrics);
    ``reduction``: a saved reduction to draw instead of the values (``"l2"``...).
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib, which is not installed: pip install \".[plot]\" "
                          "(smdebug-core's 'plot' extra)") from None
    frame = comparison.frame
    label = reduction or ""
    rows = frame[frame["reduction"] == label]
    if names is not None:
        wanted = [names] if isinstance(names, str) else list(names)
        rows = rows[rows["tensor"].isin(wanted)]
    panels = list(dict.fromkeys(rows["tensor"]))
    if not panels:
        what = f"saved reduction {label!r}" if label else "scalar values (pass a reduction)"
        raise ValueError(f"nothing to draw: no compared tensor has {what}")
    if len(panels) > max_panels:
        raise ValueError(f"{len(panels)} tensors to draw (the first: {', '.join(panels[:3])}); more than "
                         f"{max_panels} panels are unreadable: choose tensors")
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.2 * nrows + 0.6), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    styles = {"TRAIN": "-", "EVAL": "--", "PREDICT": ":", "GLOBAL": "-."}
    handles = {}
    for ax, tensor in zip(axes.flat, panels):
        part = rows[rows["tensor"] == tensor]
        for i, run in enumerate(comparison.runs):
            for mode_name in sorted(set(part["mode"]), key=lambda m: ModeKeys[m].value):
                sel = part[(part["mode"] == mode_name) & part[run].notna()]
                sel = sel.drop_duplicates("step").sort_values("step")  # the first worker's value
                if not len(sel):
                    continue
                # The reference wide and pale underneath: runs that agree still show both colours.
                (line,) = ax.plot(sel["step"], sel[run], styles.get(mode_name, "-"), color=colors[i % len(colors)],
                                  alpha=0.45 if i == 0 else 0.95, linewidth=4 if i == 0 else 1.3, zorder=2 + i, label=run,
                                  marker="." if len(sel) < 30 and i else None)
                handles.setdefault(run, line)
        div = comparison.divergence
        if div is not None:
            ax.axvline(div.step, color="0.4", linestyle=":", linewidth=1, label="_first divergence")
        ax.set_title(tensor + (f" ({label})" if label else ""), fontsize="medium")
        ax.set_xlabel("global step (first run's numbering)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    title = "compare: " + " vs ".join(comparison.runs)
    if comparison.divergence is not None:
        title += f" (first divergence at step {comparison.divergence.step}, dotted)"
    fig.suptitle(title, fontsize="medium")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 4),
               fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig

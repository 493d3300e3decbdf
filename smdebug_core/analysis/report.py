"""``smdebug report``: one self-contained HTML file showing a whole run.

    from smdebug.analysis.report import write_report
    write_report("runs/exp1", "report.html")          # or a Trial, or s3://bucket/run

Sections (each always present, saying so when the run has nothing for it): the summary
(framework, steps per mode, workers, collections with what they saved and how often, the
run's state), loss and metric curves on the global-step axis, per-layer heatmaps of one
reduction per tensor group (``gradient/``, ``update/``, ``optimizer/``, weights, biases,
module outputs...), value distributions over time of tensors saved whole, the default
rules' findings with their firing steps, and the flight recorder's trigger.

The file needs no network and no server: pictures are PNG in ``data:`` URIs and there is
no script. Needs matplotlib (the ``plot`` extra).
"""
from __future__ import annotations

import html
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..modes import ModeKeys
from .trials.health import update_ratio_table
from .heatmaps import (
    MAX_BINS,
    MAX_LINES,
    bin_series,
    draw_envelope,
    colors,
    draw_heatmap,
    fixed_layout,
    heatmap_height,
    natural_key,
    natural_sorted,
    new_figure,
    png_data_uri,
    shorten_labels,
    smooth,
)

SECTIONS = ("summary", "curves", "heatmaps", "distributions", "findings", "flight-recorder")
#: Tensors whose value distributions are drawn, and the most steps drawn of each.
MAX_DISTRIBUTIONS = 12
MAX_DISTRIBUTION_STEPS = 120
#: Elements of one saved value used for its histogram (an even sample beyond this).
_HISTOGRAM_SAMPLE = 50_000
_HISTOGRAM_BINS = 48
#: Collections naming a role rather than a kind of tensor: not heatmap groups.
_NOT_GROUPS = {"all", "default", "losses", "metrics", "scalars", "sm_metrics", "gradient_norms", "hyperparameters"}
RATIO_GROUP = "update_ratio"
_GROUP_ORDER = ("gradient", "gradients", RATIO_GROUP, "update", "optimizer", "weights", "biases", "outputs", "inputs")
_MODE_STYLE = {"TRAIN": "-", "EVAL": "--", "PREDICT": ":", "GLOBAL": "-."}
_DPI = 80
#: Seconds the default rules may take in a report (they read every step; a long run's
#: findings then cover its first steps and say so).
RULES_BUDGET_S = 5.0


def _figure(width: float, height: float):
    return new_figure(width, height, _DPI)


def _png(fig, alt: str, tight: bool = True) -> str:
    return f'<img alt="{html.escape(alt)}" src="{png_data_uri(fig, _DPI, tight)}">'


def _esc(value) -> str:
    return html.escape(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Series:
    """The run's numbers by (tensor, reduction label) (:meth:`Table.series`)."""

    def __init__(self, table):
        self.by_key: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray, np.ndarray]] = table.series()

    def labels_of(self, name: str) -> List[str]:
        return [label for (tensor, label) in self.by_key if tensor == name]


class _Run:
    """What the report reads of a run, once."""

    def __init__(self, trial, reduction: str, progress: Optional[bool], rules: bool):
        from .rules.builtin import choose_rules

        self.trial = trial
        self.reduction = reduction
        self.names = trial.tensor_names()
        chosen, self.skipped_rules, contents = choose_rules(trial)
        self.rules_wanted = rules
        self.chosen_rules = chosen if rules else []
        self.framework = contents.framework
        self.saved = contents.saved  # collection -> member names
        table = trial.to_table(self.names, reductions=[reduction], progress=progress)
        self.series = _Series(table)
        # Tensors without that reduction and without full values: their saved reductions
        # (a group's heatmap then shows the one most of them saved).
        present = {name for name, _ in self.series.by_key}
        missing = [n for n in self.names if n not in present]
        if missing:
            self.series.by_key.update(_Series(trial.to_table(missing, progress=progress)).by_key)
        self.scalars = natural_sorted({t for (t, label) in self.series.by_key if label == ""})
        # Each layer's update-to-weight ratio, when the run saved its updates (training health).
        self.series.by_key.update({(f"{RATIO_GROUP}/{name}", label): value for (name, label), value in
                                   _Series(update_ratio_table(trial, progress=progress, l2_rows=table if
                                                              reduction == "l2" else None)).by_key.items()})
        self.catalog = trial.catalog()  # what each tensor saved, and the model order
        steps = trial.steps()
        self.span = (steps[0], steps[-1]) if steps else (0, 0)
        self.markers = trial.flight_recorder_triggers()
        self.info = trial.summary()
        self.modes = [ModeKeys[m] for m in self.info["modes"]]
        self.findings: List[Tuple[str, dict]] = []
        self.rules_error: Optional[str] = None
        self.rules_last_step: Optional[int] = None
        self.rules_stopped: Optional[float] = None  # the time budget, when it stopped the rules

    def members(self, collection: str) -> List[str]:
        return self.saved.get(collection, [])


#: Name prefixes that say what a tensor is whatever its collection (``update/fc.weight``).
_KIND_PREFIXES = ("gradient", "update", RATIO_GROUP, "optimizer")


def _group_of(name: str, collection_of: Dict[str, str]) -> str:
    """A tensor's group: its kind prefix, else its collection, else its name's first part."""
    prefix = name.split("/", 1)[0] if "/" in name else None
    if prefix in _KIND_PREFIXES:
        return prefix
    return collection_of.get(name) or prefix or "other"


def _heatmap_groups(run: _Run) -> Dict[str, List[str]]:
    """Non-scalar tensors with a plottable series, by group (name prefix, else collection)."""
    collection_of: Dict[str, str] = {}
    ordered = [c for c in _GROUP_ORDER if c in run.saved] + sorted(c for c in run.saved if c not in _GROUP_ORDER)
    for cname in reversed(ordered):  # the first in order wins
        if cname in _NOT_GROUPS:
            continue
        for name in run.saved[cname]:
            collection_of[name] = cname
    scalars = set(run.scalars)
    groups: Dict[str, List[str]] = {}
    for (name, label) in run.series.by_key:
        if label and name not in scalars:
            group = groups.setdefault(_group_of(name, collection_of), [])
            if name not in group:
                group.append(name)
    order = {g: i for i, g in enumerate(_GROUP_ORDER)}
    return {g: groups[g] for g in sorted(groups, key=lambda g: (order.get(g, len(order)), g))}


def _group_label(run: _Run, names: List[str]) -> str:
    """The reduction a group's heatmap shows: the one asked for when any member has it, else
    the one most members saved."""
    counts: Dict[str, int] = {}
    for name in names:
        for label in run.series.labels_of(name):
            if label:
                counts[label] = counts.get(label, 0) + 1
    if run.reduction in counts:
        return run.reduction
    return max(sorted(counts), key=lambda k: counts[k])


# ---------------------------------------------------------------------------- sections
def _summary(run: _Run) -> str:
    trial = run.trial
    info = run.info
    if info["ended"]:
        state = "ended"
    else:
        state = f"still training, or stopped without an end marker (last complete step {trial.last_complete_step})"
    if run.markers:
        state += "; flight recorder fired (see below)"
    rows = [("run", info["path"]), ("framework", run.framework), ("state", state),
            ("workers", ", ".join(info["workers"]) or "none"), ("saved steps", info["steps"]),
            ("tensors", info["tensors"])]
    budget = trial.overhead_budget()
    if budget is not None:  # which steps were saved depended on timing (capture/budget.py)
        rows.append(("overhead budget", budget["text"]))
    for mode, (count, first, last) in info["modes"].items():
        rows.append((f"{mode} steps", f"{count} (steps {first} to {last} of {mode})" if count else "0"))
    summary = "<table class='kv'>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    summary += "</table>"
    coll_rows = []
    for cname in natural_sorted(run.saved):
        members = run.saved[cname]
        saved, every = _saved_how(run, members)
        coll_rows.append((cname, len(members), saved, every))
    summary += "<h3>Collections</h3>" + (_table(["collection", "tensors", "saved", "saved every (mode steps)"],
                                                coll_rows) if coll_rows else "<p>No collection saved a tensor.</p>")
    return summary


def _saved_how(run: _Run, members: List[str]) -> Tuple[str, str]:
    """What a collection's tensors saved (values, reductions) and their save interval per mode
    (the smallest of its tensors'), from the run's catalog."""
    kinds, labels, intervals = set(), set(), {}
    for name in members:
        entry = run.catalog.get(name)
        if entry is None:
            continue
        if entry.has_value:
            kinds.add("values")
        labels.update(entry.reductions)
        for mode, saved in entry.saved.items():
            intervals[mode] = min(saved.interval, intervals.get(mode, saved.interval))
    if labels:
        kinds.add("reductions " + ", ".join(sorted(labels)))
    every = ", ".join(f"{m.name} {g}" if g else f"{m.name} once"
                      for m, g in sorted(intervals.items(), key=lambda item: item[0].value)) or "-"
    return "; ".join(sorted(kinds)) or "-", every


def _scalar_groups(run: _Run) -> Dict[str, List[str]]:
    """The scalars by what they are: losses first, then by name prefix (``feature_importance/``)
    or collection (``metrics``), each group in natural order."""
    losses = set(run.members("losses")) | {n for n in run.scalars if "loss" in n.lower() and "/" not in n}
    collection_of: Dict[str, str] = {}
    for cname in sorted(run.saved, key=lambda c: (c != "metrics", c), reverse=True):  # metrics wins
        if cname not in ("all", "default"):
            for name in run.saved[cname]:
                collection_of[name] = cname
    groups: Dict[str, List[str]] = {}
    for name in run.scalars:
        group = "losses" if name in losses else _group_of(name, collection_of)
        groups.setdefault("metrics" if group == "other" else group, []).append(name)
    return {g: groups[g] for g in sorted(groups, key=lambda g: (g != "losses", g != "metrics", g))}


def _curves(run: _Run, smoothing: float) -> str:
    if not run.scalars:
        return "<p>The run saved no scalar (loss, metric) values.</p>"
    out = []
    for title, names in _scalar_groups(run).items():
        if len(names) > MAX_LINES:
            out.append(_scalar_heatmap(run, title, names))
        else:
            out.append(_line_figure(run, title, names, smoothing, mark_findings=title == "losses"))
    if smoothing:
        out.append(f"<p class='note'>Solid lines: exponential moving average (weight {smoothing:g}); faint: the "
                   f"saved values (past {MAX_BINS} steps, a band from each bin's min to its max, so that a "
                   "one-step spike keeps its full height). Rule firings are marked along the bottom of the "
                   "losses.</p>")
    else:
        out.append(f"<p class='note'>Curves of more than {MAX_BINS} steps are drawn as a band from each bin's "
                   "min to its max, so that a one-step spike keeps its full height.</p>")
    return "".join(out)


def _line_figure(run: _Run, title: str, names: List[str], smoothing: float, mark_findings: bool) -> str:
    fig = _figure(12.5, 3.6)
    ax = fig.add_subplot()
    palette = colors(len(names))
    labels, _ = shorten_labels(names)
    for name, label, color in zip(names, labels, palette):
        steps, values, modes = run.series.by_key[(name, "")]
        for mode in sorted(set(modes.tolist()), key=lambda m: ModeKeys[m].value):
            sel = modes == mode
            x, y = steps[sel], values[sel]
            style = _MODE_STYLE.get(mode, "-")
            text = f"{label} ({mode})"
            if smoothing and len(x) > 5:
                draw_envelope(ax, x, y, color, style)  # faint: every saved value, or each bin's min..max
                ax.plot(x, smooth(y, smoothing), style, color=color, label=text, linewidth=1.4)
            elif len(x) > MAX_BINS:
                draw_envelope(ax, x, y, color, style, label=text)
            else:
                ax.plot(x, y, style, color=color, label=text, marker="." if len(x) < 40 else None)
    _mark_events(run, ax, findings=mark_findings)
    ax.set_xlim(run.span[0] - 0.5, run.span[1] + 0.5)
    ax.set_xlabel("global step (all modes on one axis)")
    ax.set_ylabel("value")
    finite = np.concatenate([run.series.by_key[(n, "")][1] for n in names])
    finite = finite[np.isfinite(finite)]
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() >= 100:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig, f"{title} over the global steps")


def _mark_events(run: _Run, ax, findings: bool) -> None:
    """Firing steps of the rules (ticks along the bottom) and the flight recorder's trigger."""
    if findings:
        fired = [(rule, report) for rule, report in run.findings if report["violations"]]
        for (rule, report), color in zip(fired, colors(len(fired))):
            steps = sorted({v["step"] for v in report["violations"] if v["step"] >= 0})
            if steps:
                ax.plot(steps, np.full(len(steps), 0.02), "|", color=color, markersize=12,
                        transform=ax.get_xaxis_transform(), label=f"{rule} fired")
    for worker, marker in sorted(run.markers.items()):
        step = marker.get("global_step")
        if isinstance(step, int):
            ax.axvline(step, color="red", linewidth=1, alpha=0.7, label=f"flight recorder ({worker})")


def _scalar_heatmap(run: _Run, title: str, names: List[str]) -> str:
    series = [(n, *run.series.by_key[(n, "")][:2]) for n in names]
    binned = bin_series(series, MAX_BINS, run.span)
    fig = _figure(12.5, heatmap_height(len(names)))
    fixed_layout(fig, shorten_labels(names)[0])
    ax = fig.add_subplot()
    draw_heatmap(ax, binned, "value", xlabel="global step (all modes on one axis)")
    _heading(ax, f"{title} ({len(names)} series)")
    return _png(fig, f"{title} heatmap", tight=False)


def _heading(ax, text: str) -> None:
    """A heatmap's heading, as a text (a title's placement measures every tick label)."""
    ax.text(0.0, 1.01, text, fontsize=10, ha="left", va="bottom", transform=ax.transAxes)


def _in_model_order(run: _Run, names: List[str]) -> List[str]:
    """Rows in the order the model produced its layers (a derived tensor at its parameter's
    place: gradients come in backward order), the rest after them (trials/order.py)."""
    return run.catalog.order.by_layer(names)


def _binned_groups(run: _Run, groups: Dict[str, List[str]]):
    """Each heatmap's data: (group, reduction shown, its Binned rows in model order, how many
    of the group's tensors lack that reduction); a bin holds its extreme, never the mean."""
    for group, names in groups.items():
        label = _group_label(run, names)
        members = _in_model_order(run, [n for n in names if (n, label) in run.series.by_key])
        series = [(n, *run.series.by_key[(n, label)][:2]) for n in members]
        yield group, label, bin_series(series, MAX_BINS, run.span), len(names) - len(members)


def _heatmaps(run: _Run) -> str:
    groups = _heatmap_groups(run)
    if not groups:
        return "<p>The run saved no tensor with reductions or full values to show per layer.</p>"
    out = []
    for group, label, binned, left_out in _binned_groups(run, groups):
        members = binned.rows
        fig = _figure(12.5, heatmap_height(len(members)))
        fixed_layout(fig, shorten_labels(members)[0])
        ax = fig.add_subplot()
        draw_heatmap(ax, binned, label, xlabel="global step (all modes on one axis)")
        _, prefix = shorten_labels(members)
        _heading(ax, f"{group}: {label} per tensor ({len(members)} tensors{', ' + prefix if prefix else ''})")
        _mark_events(run, ax, findings=False)
        note = f"<p class='note'>{left_out} tensors of this group have no {_esc(label)} and are left out.</p>" \
            if left_out else ""
        out.append(f"<h3>{_esc(group)}</h3>{_png(fig, f'{group} heatmap of {label}', tight=False)}{note}")
    out.append("<p class='note'>Rows: tensors in the order the model produced them (gradients at their weight's place), the rest in natural order; columns: bins of global steps (each bin its extreme, "
               "the value of largest magnitude saved in it, never the mean, so that a one-step spike keeps its "
               "full height; a tensor saved less often holds its last value until its next save; grey: not "
               "saved yet; magenta: NaN or infinity). Reductions of tensors saved whole are computed from their "
               "values.</p>")
    return "".join(out)


def _distribution_tensors(run: _Run) -> Tuple[List[str], int]:
    """Up to MAX_DISTRIBUTIONS tensors saved whole: weights first, spread evenly through the
    model when there are more; and how many there are."""
    scalars = set(run.scalars)
    whole = [n for n in run.names if n not in scalars and n in run.catalog and run.catalog[n].has_value]
    weights = set(run.members("weights"))
    ranked = sorted(whole, key=lambda n: (n not in weights, n.startswith("gradient/"), natural_key(n)))
    first = [n for n in ranked if n in weights] or ranked
    if len(first) > MAX_DISTRIBUTIONS:
        picks = np.linspace(0, len(first) - 1, MAX_DISTRIBUTIONS).round().astype(int)
        return [first[i] for i in sorted(set(picks.tolist()))], len(whole)
    return ranked[:MAX_DISTRIBUTIONS], len(whole)


def _distributions(run: _Run) -> str:
    from matplotlib.cm import ScalarMappable

    names, total = _distribution_tensors(run)
    if not names:
        return "<p>The run saved no tensor whole (only scalars or reductions): no value distributions.</p>"
    cols = 3 if len(names) > 4 else len(names)
    rows = -(-len(names) // cols)
    fig = _figure(12.5, 0.4 + 2.6 * rows)
    titles, _ = shorten_labels(names)
    sampled_any = False
    for i, (name, title) in enumerate(zip(names, titles)):
        ax = fig.add_subplot(rows, cols, i + 1)
        sampled_any |= _distribution(run, name, title, ax)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    colorbar = fig.colorbar(ScalarMappable(_share_norm(), _SHARE_CMAP), cax=fig.add_axes((0.945, 0.1, 0.012, 0.8)))
    colorbar.set_label("share of the step's values in the bin (log scale)")
    note = (f"<p class='note'>{len(names)} of {total} tensors saved whole. Each column is one saved step's histogram "
            "over the range of all its steps; the steps are those saved, evenly spaced whatever their numbers.")
    if sampled_any:
        note += f" Tensors saved at more than {MAX_DISTRIBUTION_STEPS} steps show that many, evenly spread."
    return _png(fig, "value distributions over the saved steps") + note + "</p>"


def _share_norm():
    from matplotlib.colors import LogNorm

    return LogNorm(1e-3, 1.0, clip=True)


_SHARE_CMAP = "magma_r"


def _distribution(run: _Run, name: str, title: str, ax) -> bool:
    tensor = run.trial.tensor(name)
    steps = [g for g in tensor.steps() if tensor.has_value(g)]
    sampled = len(steps) > MAX_DISTRIBUTION_STEPS
    if sampled:
        steps = [steps[i] for i in np.linspace(0, len(steps) - 1, MAX_DISTRIBUTION_STEPS).round().astype(int)]
    samples = []
    for g in steps:
        try:
            value = np.asarray(tensor.value(g), dtype=np.float64).reshape(-1)
        except Exception:  # noqa: BLE001 - an unreadable or non-numeric value is a blank column
            value = np.zeros(0)
        if value.size > _HISTOGRAM_SAMPLE:
            value = value[:: value.size // _HISTOGRAM_SAMPLE + 1]
        samples.append(value[np.isfinite(value)])
    finite = [s for s in samples if s.size]
    ax.set_title(title if len(title) <= 45 else "..." + title[-42:], fontsize=9)
    if not finite:
        ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
        return sampled
    lo = min(float(s.min()) for s in finite)
    hi = max(float(s.max()) for s in finite)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, _HISTOGRAM_BINS + 1)
    matrix = np.full((_HISTOGRAM_BINS, len(steps)), np.nan)
    for j, s in enumerate(samples):
        if s.size:
            counts, _ = np.histogram(s, edges)
            matrix[:, j] = np.where(counts > 0, counts / s.size, np.nan)
    ax.set_facecolor("#f4f4f4")
    ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", origin="lower", interpolation="nearest",
              cmap=_SHARE_CMAP, norm=_share_norm(), extent=(-0.5, len(steps) - 0.5, lo, hi))
    ticks = sorted(set(np.linspace(0, len(steps) - 1, min(5, len(steps))).round().astype(int).tolist()))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(steps[t]) for t in ticks], fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("global step (saved steps)", fontsize=8)
    ax.set_ylabel("value", fontsize=8)
    return sampled


class _OutOfTime(Exception):
    """The rules' time budget is spent."""


def _run_rules(run: _Run, progress: Optional[bool], budget: float) -> None:
    from .rules import run_rules
    from .rules.builtin import make_rule

    if not run.chosen_rules:
        return
    deadline = time.monotonic() + budget if budget else None

    def on_step(step):
        run.rules_last_step = step
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime

    try:
        rules = [make_rule(name, run.trial) for name in run.chosen_rules]
        try:
            run_rules(rules, follow=False, progress=bool(progress), on_step=on_step)
        except _OutOfTime:
            run.rules_stopped = budget
    except Exception as exc:  # noqa: BLE001 - a rule that cannot run is a finding of its own, not a failed report
        run.rules_error = f"{type(exc).__name__}: {exc}"
        return
    run.findings = [(rule.rule_name, rule.report.to_dict()) for rule in rules]


def _findings(run: _Run) -> str:
    from .rules.report import summary_line

    out = []
    if run.rules_error:
        out.append(f"<p class='bad'>The rules could not run: {_esc(run.rules_error)}</p>")
    if run.rules_stopped is not None:
        out.append(f"<p class='bad'>The rules evaluated global steps {run.span[0]} to {run.rules_last_step} of "
                   f"{run.span[0]} to {run.span[1]}: their time budget ({run.rules_stopped:g} s) was spent. "
                   "<code>smdebug report --rules-budget 0</code> or <code>smdebug rules RUN</code> evaluates every "
                   "step.</p>")
    if run.findings:
        rows = []
        for rule, report in run.findings:
            verdict = "FIRED" if report["triggered"] else "ok"
            rows.append((rule, verdict, summary_line(None, report)))
        out.append(_table(["rule", "verdict", "what it found"], rows).replace(
            "<td>FIRED</td>", "<td class='bad'>FIRED</td>"))
        fired = [(rule, report) for rule, report in run.findings if report["violations"]]
        if fired:
            fig = _figure(12.5, 0.9 + 0.35 * len(fired))
            ax = fig.add_subplot()
            for i, ((rule, report), color) in enumerate(zip(fired, colors(len(fired)))):
                steps = sorted({v["step"] for v in report["violations"] if v["step"] >= 0})
                ax.plot(steps, np.full(len(steps), i), "|", color=color, markersize=14, markeredgewidth=2)
            ax.set_yticks(range(len(fired)))
            ax.set_yticklabels([rule for rule, _ in fired])
            ax.set_ylim(-0.6, len(fired) - 0.4)
            ax.set_xlim(run.span[0] - 0.5, run.span[1] + 0.5)
            ax.set_xlabel("global step (all modes on one axis)")
            ax.set_title("steps at which each rule fired", loc="left", fontsize=10)
            ax.grid(True, axis="x", alpha=0.3)
            out.append(_png(fig, "rule firing steps"))
    elif not run.rules_wanted:
        return "<p>Rules were not run (asked not to).</p>"
    elif not run.rules_error:
        out.append("<p>No default rule has anything to read in this run.</p>")
    if run.skipped_rules:
        rows = sorted(run.skipped_rules.items())
        out.append(f"<details><summary>{len(rows)} default rules skipped</summary>"
                   f"{_table(['rule', 'why'], rows)}</details>")
    return "".join(out)


def _flight_recorder(run: _Run) -> str:
    if not run.markers:
        return "<p>The flight recorder did not fire.</p>"
    rows = []
    for worker, marker in sorted(run.markers.items()):
        origin = marker.get("first_nonfinite") or {}
        where = f"{origin.get('phase')} of {origin.get('module')}" if origin else "-"
        rows.append((worker, marker.get("trigger"), marker.get("global_step"), marker.get("reason"), where,
                     marker.get("steps_written")))
    return ("<p class='bad'>The flight recorder fired.</p>"
            + _table(["worker", "trigger", "global step", "reason", "first non-finite (module)", "steps written"],
                     rows))


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}img{max-width:100%;height:auto;display:block;margin:.5em 0}
.note{color:#555;font-size:.85em}.bad{color:#b00020;font-weight:bold}nav a{margin-right:1em}
"""


def render_report(trial, reduction: str = "l2", smoothing: float = 0.6, rules: bool = True,
                  progress: Optional[bool] = None, rules_budget: float = RULES_BUDGET_S) -> str:
    """The report of ``trial`` as an HTML text (see :func:`write_report`)."""
    from .trials.progress import progress_wanted

    show = progress_wanted(trial.progress if progress is None else progress)
    bar = _stage_bar(show)
    started = time.time()
    run = _Run(trial, reduction, progress, rules)
    _advance(bar, "rules")
    _run_rules(run, show, rules_budget)
    parts = {}
    for section, make in (("summary", lambda: _summary(run)), ("curves", lambda: _curves(run, smoothing)),
                          ("heatmaps", lambda: _heatmaps(run)), ("distributions", lambda: _distributions(run)),
                          ("findings", lambda: _findings(run)), ("flight-recorder", lambda: _flight_recorder(run))):
        _advance(bar, section)
        parts[section] = make()
    if bar is not None:
        bar.close()
    titles = {"summary": "Summary", "curves": "Loss and metric curves", "heatmaps": "Per-layer heatmaps",
              "distributions": "Value distributions over time", "findings": "Findings (default rules)",
              "flight-recorder": "Flight recorder"}
    nav = "".join(f"<a href='#{s}'>{titles[s]}</a>" for s in SECTIONS)
    body = "".join(f"<section id='{s}'><h2>{titles[s]}</h2>{parts[s]}</section>" for s in SECTIONS)
    from .._version import __version__

    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>smdebug report: "
            f"{_esc(trial.name)}</title><style>{_CSS}</style></head><body>"
            f"<h1>smdebug report: {_esc(trial.name)}</h1><p class='note'>{_esc(trial.path)}; made {made} by "
            f"smdebug-core {__version__} in {time.time() - started:.1f} s</p><nav>{nav}</nav>{body}</body></html>")


def _stage_bar(show: bool):
    if not show:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a declared dependency
        return None
    return tqdm(total=len(SECTIONS) + 1, desc="smdebug report", unit="part", leave=False)


def _advance(bar, what: str) -> None:
    if bar is not None:
        bar.set_postfix_str(what)
        bar.update(1)


def write_report(run, output: str = "report.html", reduction: str = "l2", smoothing: float = 0.6,
                 rules: bool = True, progress: Optional[bool] = None, rules_budget: float = RULES_BUDGET_S) -> str:
    """Write the HTML report of ``run`` (a Trial, a run directory or an ``s3://`` URL) to
    ``output``; returns ``output``.

    Args:
        reduction: what the per-layer heatmaps show (``l2``, ``abs_max``, ``mean``...): saved
            where it was saved, computed from full values otherwise; a group with neither
            shows the reduction most of its tensors saved.
        smoothing: the curves' exponential moving average weight (0: none).
        rules: run the default rules for the findings section.
        rules_budget: seconds the rules may take (0: no limit); past it they stop and the
            findings say up to which step they evaluated.
        progress: a progress bar (default: on a terminal).
    """
    from .trials import create_trial
    from .trials.computed import parse_reductions

    parse_reductions([reduction])
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
    if not rules_budget >= 0:
        raise ValueError(f"rules_budget must be >= 0 seconds (0: no limit), got {rules_budget!r}")
    trial = create_trial(run) if isinstance(run, (str, os.PathLike)) else run
    text = render_report(trial, reduction=reduction, smoothing=smoothing, rules=rules, progress=progress,
                         rules_budget=rules_budget)
    with open(output, "w", encoding="utf-8") as fh:
        fh.write(text)
    return output

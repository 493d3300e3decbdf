"""Plots of a run with matplotlib (the ``plot`` extra): values or reductions over steps,
and a tensor's histogram at a step. Used by the ``smdebug plot`` command too.

    from smdebug.analysis.plots import plot_tensors, plot_histogram
    ax = plot_tensors(trial, ["loss", "gradient/Net_fc1.weight"], reduction="l2")
    ax.figure.savefig("curves.png")

Data comes from ``Trial.to_table`` (no pandas needed).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from ..modes import ModeKeys

#: Line styles per mode, so that modes stay apart when colors go to tensors.
_MODE_STYLES = {"TRAIN": "-", "EVAL": "--", "PREDICT": ":", "GLOBAL": "-."}


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib, which is not installed: pip install matplotlib "
                          "(smdebug-core's 'plot' extra)") from None
    return plt


def _new_axes(ax, figsize=(8, 4.5)):
    if ax is not None:
        return ax
    fig, ax = _pyplot().subplots(figsize=figsize)
    return ax


def plot_tensors(trial, names: Union[str, Sequence[str]], reduction: Optional[Union[str, Sequence[str]]] = None,
                 mode=None, x: str = "step", worker: Optional[str] = None, ax=None, title: Optional[str] = None,
                 logy: bool = False, smooth: float = 0.0, heatmap: Optional[bool] = None):
    """Lines of tensors' scalar values or reductions over the steps; returns the Axes.

    One line per tensor (and reduction) and per mode: tensors get distinct colours, modes
    line styles (TRAIN solid, EVAL dashed, PREDICT dotted). Past
    :data:`~smdebug.analysis.heatmaps.MAX_LINES` series (or with ``heatmap=True``) it draws
    a heatmap instead: one row per series in natural order, steps binned, each bin showing
    its extreme (the value of largest magnitude), never the mean, so that spikes stay.

    Args:
        trial: an open Trial.
        names: a tensor name or several; an item may also be a ``(name, reduction)`` pair,
            which plots that reduction of that tensor whatever ``reduction`` says (a loss
            and gradient norms on one figure).
        reduction: None (the tensors' own values; a tensor that has none gets a clear
            error), a reduction (``"l2"``, ``"abs_max"``...), or several. A reduction the
            run did not save is computed from the tensor's saved full values.
        mode: a mode or list of modes (default: all).
        x: ``"step"`` (global steps: one time line for all modes, the default) or
            ``"mode_step"`` (each mode from its step 0).
        worker: whose values (default: the first worker that saved each value).
        ax: a matplotlib Axes to draw on (default: a new figure).
        logy: a logarithmic y axis (a logarithmic colour scale for a heatmap).
        smooth: exponential moving average weight in [0, 1) (TensorBoard's smoothing): the
            smoothed line is drawn over the faint saved values (past 500 values, a band from
            each bin's min to its max, which keeps every spike). 0: none.
        heatmap: force (True) or forbid (False) the heatmap; None: past MAX_LINES series.
    """
    from . import heatmaps

    if x not in ("step", "mode_step"):
        raise ValueError(f"x must be 'step' or 'mode_step', got {x!r}")
    if not 0 <= smooth < 1:
        raise ValueError(f"smooth must be in [0, 1), got {smooth!r}")
    names = [names] if isinstance(names, (str, tuple)) else list(names)
    if not names:
        raise ValueError("plot_tensors needs at least one tensor name")
    reductions = [reduction] if reduction is None or isinstance(reduction, str) else list(reduction)
    default_labels = ["" if r is None else r for r in reductions]
    series_of = []  # (tensor, [reduction labels])
    for item in names:
        if isinstance(item, tuple):
            series_of.append((item[0], ["" if item[1] is None else item[1]]))
        else:
            series_of.append((item, default_labels))
    wanted = sorted({label for _, labels in series_of for label in labels if label})
    table = trial.to_table(sorted({n for n, _ in series_of}), mode=mode, workers=None if worker is None else [worker],
                           reductions=wanted or None)
    tensor_col, red_col = table.column("tensor"), table.column("reduction")
    xs = table.numbers[x]
    values = table.numbers["value"]
    steps = table.numbers["step"]

    def rows_of(column, text):  # by category code: one vectorized comparison per series, not per row
        codes, categories = table.texts[column]
        return codes == (categories.index(text) if text in categories else -1)

    m_codes, m_cats = table.texts["mode"]
    lines = []  # (name, label, mode name, x, y)
    for name, labels in series_of:
        is_name = rows_of("tensor", name)
        for label in labels:
            is_red = is_name & rows_of("reduction", label)
            if not is_red.any():
                raise ValueError(_nothing_to_plot(trial, name, label, red_col, tensor_col))
            for mode_name in sorted({m_cats[c] for c in np.unique(m_codes[is_red]).tolist()},
                                    key=lambda m: ModeKeys[m].value):
                sel = is_red & rows_of("mode", mode_name)
                # The first worker's value at each step (rows are sorted by worker, then step).
                _, first = np.unique(steps[sel], return_index=True)
                line_x, line_y = xs[sel][first], values[sel][first]
                order = np.argsort(line_x, kind="stable")
                lines.append((name, label, mode_name, line_x[order], line_y[order]))
    series = list(dict.fromkeys((name, label) for name, label, *_ in lines))
    ax = _new_axes(ax)
    if heatmap or (heatmap is None and len(series) > heatmaps.MAX_LINES):
        _heatmap_of_lines(ax, lines, series, x, logy)
    else:
        _draw_lines(ax, lines, series, smooth)
        if logy:
            ax.set_yscale("log")
        used = {label for _, label in series}
        ax.set_ylabel(used.pop() if len(used) == 1 and "" not in used else "value")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        ax.set_xlabel(_STEP_AXIS[x])
    ax.set_title(title if title is not None else f"{trial.name}")
    return ax


_STEP_AXIS = {"step": "global step (all modes on one axis)", "mode_step": "step of each mode (each from 0)"}


def _nothing_to_plot(trial, name, label, red_col, tensor_col) -> str:
    saved = sorted({r for r, t in zip(red_col, tensor_col) if t == name and r})
    if label:
        return f"tensor {name!r} has no saved reduction {label!r} and no saved value to compute it from; " \
               f"saved: {', '.join(saved) or 'none'}"
    if saved:
        return f"tensor {name!r} has no scalar values to plot; its saved reductions: {', '.join(saved)} " \
               "(pass reduction=...)"
    entry = trial.catalog().get(name)
    if entry is not None and entry.has_value:
        return (f"tensor {name!r} has no scalar values to plot: it is saved whole; plot a reduction computed "
                "from its values (pass reduction='l2', 'abs_max'...) or a histogram (plot_histogram)")
    return f"tensor {name!r} has no scalar values to plot; saved: none"


def _draw_lines(ax, lines, series, smooth: float) -> None:
    from .heatmaps import colors, draw_envelope, smooth as ema

    color_of = dict(zip(series, colors(len(series))))
    for name, label, mode_name, line_x, line_y in lines:
        color = color_of[(name, label)]
        style = _MODE_STYLES.get(mode_name, "-")
        text = name + (f" {label}" if label else "") + f" ({mode_name})"
        if smooth and len(line_x) > 5:
            draw_envelope(ax, line_x, line_y, color, style)  # faint: the values, or each bin's min..max band
            ax.plot(line_x, ema(line_y, smooth), style, color=color, label=text)
        else:
            ax.plot(line_x, line_y, style, color=color, label=text, marker="." if len(line_x) < 30 else None)


def _heatmap_of_lines(ax, lines, series, x: str, logy: bool) -> None:
    """One row per (tensor, reduction), modes joined on the step axis, rows in natural order."""
    from .heatmaps import bin_series, draw_heatmap, heatmap_height, natural_key

    rows = {}
    for name, label, _, line_x, line_y in lines:
        xs, ys = rows.setdefault((name, label), ([], []))
        xs.append(line_x)
        ys.append(line_y)
    ordered = sorted(series, key=lambda key: (natural_key(key[0]), key[1]))
    labels = {label for _, label in ordered}
    binned = bin_series([(name + (f" {label}" if label and len(labels) > 1 else ""),
                          np.concatenate(rows[(name, label)][0]), np.concatenate(rows[(name, label)][1]))
                         for name, label in ordered])
    fig = ax.figure
    if len(fig.axes) == 1:  # our own figure: tall enough for every row
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, max(height, heatmap_height(len(ordered))))
    draw_heatmap(ax, binned, labels.pop() if len(labels) == 1 and "" not in labels else "value",
                 log=True if logy else None, xlabel=_STEP_AXIS[x])


def plot_histogram(trial, name: str, step: int, mode=ModeKeys.GLOBAL, worker: Optional[str] = None,
                   bins: int = 50, ax=None, title: Optional[str] = None):
    """A histogram of a tensor's saved value at a step (``mode``'s numbering); returns the Axes."""
    value = trial.tensor(name).value(step, mode=mode, worker=worker)
    if value.dtype.kind not in "biuf" and value.dtype.kind != "V":
        raise ValueError(f"tensor {name!r} at step {step} holds {value.dtype} data; a histogram needs numbers")
    flat = np.asarray(value, dtype=np.float64).reshape(-1)
    finite = flat[np.isfinite(flat)]
    ax = _new_axes(ax)
    ax.hist(finite, bins=bins, color="#4c72b0")
    mode = ModeKeys.parse(mode)
    where = f"step {step}" if mode is ModeKeys.GLOBAL else f"{mode.name} step {step}"
    dropped = flat.size - finite.size
    ax.set_title(title if title is not None else
                 f"{name} at {where} ({flat.size} values{f', {dropped} not finite' if dropped else ''})")
    ax.set_xlabel("value")
    ax.set_ylabel("count")
    ax.grid(True, alpha=0.3)
    return ax

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
                 logy: bool = False):
    """Lines of tensors' scalar values or saved reductions over the steps; returns the Axes.

    One line per tensor (and reduction) and per mode: tensors get colors, modes line
    styles (TRAIN solid, EVAL dashed, PREDICT dotted).

    Args:
        trial: an open Trial.
        names: a tensor name or several; an item may also be a ``(name, reduction)`` pair,
            which plots that reduction of that tensor whatever ``reduction`` says (a loss
            and gradient norms on one figure).
        reduction: None (the tensors' own values; a tensor that has none and saved
            reductions gets a clear error), a saved reduction (``"l2"``, ``"abs_max"``...),
            or several.
        mode: a mode or list of modes (default: all).
        x: ``"step"`` (global steps: one time line for all modes) or ``"mode_step"``
            (each mode from its step 0).
        worker: whose values (default: the first worker that saved each value).
        ax: a matplotlib Axes to draw on (default: a new figure).
        logy: a logarithmic y axis.
    """
    if x not in ("step", "mode_step"):
        raise ValueError(f"x must be 'step' or 'mode_step', got {x!r}")
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
    table = trial.to_table(sorted({n for n, _ in series_of}), mode=mode, workers=None if worker is None else [worker])
    tensor_col, red_col, mode_col = table.column("tensor"), table.column("reduction"), table.column("mode")
    xs = table.numbers[x]
    values = table.numbers["value"]
    steps = table.numbers["step"]
    ax = _new_axes(ax)
    colors = _pyplot().rcParams["axes.prop_cycle"].by_key().get("color", [None])
    drawn = 0
    series = 0  # one color per (tensor, reduction); modes differ by line style
    for name, labels in series_of:
        is_name = np.fromiter((t == name for t in tensor_col), bool, len(tensor_col))
        for label in labels:
            is_red = is_name & np.fromiter((r == label for r in red_col), bool, len(red_col))
            if not is_red.any():
                saved = sorted({r for r, t in zip(red_col, tensor_col) if t == name and r})
                what = f"saved reduction {label!r}" if label else "scalar values"
                hint = (f"; its saved reductions: {', '.join(saved)} (pass reduction=...)" if saved and not label
                        else f"; saved: {', '.join(saved) or 'none'}")
                raise ValueError(f"tensor {name!r} has no {what} to plot{hint}")
            color = colors[series % len(colors)]
            series += 1
            for mode_name in sorted({m for m, keep in zip(mode_col, is_red) if keep},
                                    key=lambda m: ModeKeys[m].value):
                sel = is_red & np.fromiter((m == mode_name for m in mode_col), bool, len(mode_col))
                # The first worker's value at each step (rows are sorted by worker, then step).
                _, first = np.unique(steps[sel], return_index=True)
                line_x, line_y = xs[sel][first], values[sel][first]
                order = np.argsort(line_x, kind="stable")
                text = name + (f" {label}" if label else "") + f" ({mode_name})"
                ax.plot(line_x[order], line_y[order], _MODE_STYLES.get(mode_name, "-"),
                        color=color, label=text, marker="." if len(first) < 30 else None)
                drawn += 1
    ax.set_xlabel("global step" if x == "step" else "mode step")
    used = {label for _, labels in series_of for label in labels}
    ax.set_ylabel(used.pop() if len(used) == 1 and "" not in used else "value")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title if title is not None else f"{trial.name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return ax


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

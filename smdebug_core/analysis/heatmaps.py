"""What the report and the plots share to draw many series readably: a natural sort of
tensor names, smoothing, distinct colours, and heatmaps of series over binned steps.

A heatmap has one row per series (a layer) and one column per bin of global steps; a
bin's colour is its extreme, the value of largest magnitude saved in it (sign kept), never
the mean, so that a one-step spike in a 10,000-step run keeps its full height; a series saved less often than
the bins holds its value until its next save, so that sparse saves stay visible. The
colour scale turns logarithmic when the values are positive and span decades. Bins
holding a NaN or an infinity are drawn in magenta whatever their neighbours.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import numpy as np

#: Beyond this many series a line plot is unreadable: plots switch to a heatmap.
MAX_LINES = 10
#: The most step bins of a heatmap (a figure is about this many pixels wide).
MAX_BINS = 500
#: A colour scale turns logarithmic when the largest value is this many times the smallest.
LOG_SPAN = 100.0
NONFINITE_COLOR = "#e7298a"

_NUMBER = re.compile(r"(\d+)")


def natural_key(name: str):
    """Sort key ordering names as people count: ``layer2`` before ``layer10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part.lower()) for part in _NUMBER.split(name) if part]


def natural_sorted(names) -> List[str]:
    return sorted(names, key=natural_key)


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """An exponential moving average (TensorBoard's smoothing): ``weight`` 0 changes nothing,
    0.99 smooths a lot. NaN and infinite values are skipped, not spread."""
    values = np.asarray(values, dtype=np.float64)
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight!r}")
    if weight == 0 or len(values) == 0:
        return values
    out = np.empty_like(values)
    last, debias = 0.0, 0.0
    for i, v in enumerate(values.tolist()):
        if np.isfinite(v):
            last = last * weight + (1 - weight) * v
            debias = debias * weight + (1 - weight)
            out[i] = last / debias
        else:
            out[i] = v
    return out


def colors(count: int) -> List:
    """``count`` colours, distinct as far as possible (tab10, then tab20, then evenly spaced hues)."""
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, count)]


def shorten_labels(names: Sequence[str]) -> Tuple[List[str], str]:
    """The names without the prefix they all share (cut at a separator), and that prefix."""
    if len(names) < 2:
        return list(names), ""
    common = names[0]
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    cut = max(common.rfind(sep) for sep in "/_.") + 1 if common else 0
    if cut <= 0:
        return list(names), ""
    return [name[cut:] or name for name in names], names[0][:cut]


#: What a bin of a heatmap shows, in the words its caption uses.
BIN_EXTREME = "max |value|"
BIN_MEAN = "mean"


class Binned:
    """Series over the global steps, binned: ``matrix`` (rows x bins, NaN where a series had
    no value yet), ``nonfinite`` (bins that held a NaN or infinity), ``edges`` (bins + 1 step
    numbers), ``rows`` (the series' names) and ``shows`` (:data:`BIN_EXTREME` or
    :data:`BIN_MEAN`: what a bin's value is)."""

    def __init__(self, matrix, nonfinite, edges, rows, shows=BIN_EXTREME):
        self.matrix, self.nonfinite, self.edges, self.rows = matrix, nonfinite, edges, rows
        self.shows = shows

    @property
    def width(self) -> int:
        """Steps per bin."""
        return int(self.edges[1] - self.edges[0]) if len(self.edges) > 1 else 1


def _bin_extreme(where: np.ndarray, values: np.ndarray, nbins: int) -> np.ndarray:
    """Per bin, the value of largest magnitude among ``values`` (sign kept; NaN: empty bin)."""
    row = np.full(nbins, np.nan)
    if not len(values):
        return row
    order = np.lexsort((np.abs(values), where))  # by bin, then by magnitude: each bin's last wins
    where, values = where[order], values[order]
    last = np.append(where[1:] != where[:-1], True)
    row[where[last]] = values[last]
    return row


def bin_series(series: Sequence[Tuple[str, np.ndarray, np.ndarray]], max_bins: int = MAX_BINS,
               span: Optional[Tuple[int, int]] = None, mean: bool = False) -> Binned:
    """``series``: (name, steps, values) each; the bins cover ``span`` (first and last step,
    default: those of all series) with at most ``max_bins`` bins of whole steps. A bin's value
    is its extreme (the saved value of largest magnitude, sign kept), so that no spike is
    averaged away; ``mean``: the mean of its values instead."""
    all_steps = [s for _, s, _ in series if len(s)]
    if span is None:
        span = (int(min(s.min() for s in all_steps)), int(max(s.max() for s in all_steps))) if all_steps else (0, 0)
    first, last = span
    width = max(1, int(np.ceil((last - first + 1) / max_bins)))
    nbins = max(1, (last - first) // width + 1)
    edges = first + width * np.arange(nbins + 1)
    matrix = np.full((len(series), nbins), np.nan)
    nonfinite = np.zeros((len(series), nbins), bool)
    for r, (_, steps, values) in enumerate(series):
        steps = np.asarray(steps, np.int64)
        values = np.asarray(values, np.float64)
        inside = (steps >= first) & (steps <= last)
        steps, values = steps[inside], values[inside]
        if not len(steps):
            continue
        where = (steps - first) // width
        finite = np.isfinite(values)
        counts = np.bincount(where[finite], minlength=nbins)
        nonfinite[r] = np.bincount(where[~finite], minlength=nbins) > 0
        has = counts > 0
        if mean:
            row = np.full(nbins, np.nan)
            row[has] = np.bincount(where[finite], values[finite], nbins)[has] / counts[has]
        else:
            row = _bin_extreme(where[finite], values[finite], nbins)
        # Between saves, a series holds its last value (a series saved every 50 steps stays
        # visible on a 1-step grid); before its first save it is empty.
        filled = has | nonfinite[r]
        idx = np.where(filled, np.arange(nbins), -1)
        np.maximum.accumulate(idx, out=idx)
        last_saved = int(np.flatnonzero(filled)[-1])
        hold = (idx >= 0) & (np.arange(nbins) <= last_saved + _hold_limit(steps, width))
        row = np.where(hold, row[np.maximum(idx, 0)], np.nan)
        matrix[r] = row
    return Binned(matrix, nonfinite, edges, [name for name, _, _ in series], BIN_MEAN if mean else BIN_EXTREME)


class Envelope:
    """A curve downsampled to at most ``max_bins`` bins that keeps each bin's extremes:
    ``x`` (each non-empty bin's first step), ``lo`` and ``hi`` (its smallest and largest finite
    value) and ``width`` (steps per bin; 1: every value, nothing dropped)."""

    def __init__(self, x, lo, hi, width):
        self.x, self.lo, self.hi, self.width = x, lo, hi, width


def envelope(steps: np.ndarray, values: np.ndarray, max_bins: int = MAX_BINS) -> Envelope:
    """The min/max envelope of ``values`` over ``steps`` in at most ``max_bins`` bins of
    whole steps: no spike, up or down, is lost however many steps the curve has."""
    steps = np.asarray(steps, np.int64)
    values = np.asarray(values, np.float64)
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if not len(steps):
        empty = np.zeros(0)
        return Envelope(empty, empty, empty, 1)
    first, last = int(steps.min()), int(steps.max())
    width = max(1, int(np.ceil((last - first + 1) / max_bins)))
    nbins = (last - first) // width + 1
    where = (steps - first) // width
    hi = np.full(nbins, -np.inf)
    lo = np.full(nbins, np.inf)
    np.maximum.at(hi, where, values)
    np.minimum.at(lo, where, values)
    has = np.isfinite(hi)  # empty bins are left out: a sparse curve's band stays joined
    return Envelope((first + width * np.arange(nbins))[has], lo[has], hi[has], width)


def draw_envelope(ax, steps: np.ndarray, values: np.ndarray, color, style: str = "-", label=None,
                  max_bins: int = MAX_BINS) -> bool:
    """Draw a long curve as its min/max envelope (a band from each bin's min to its max, so
    spikes stay at full height); a curve of at most ``max_bins`` values is drawn as it is.
    Returns whether it was binned."""
    if len(values) <= max_bins:
        ax.plot(steps, values, style, color=color, alpha=0.25, linewidth=0.8, label=label)
        return False
    env = envelope(steps, values, max_bins)
    ax.fill_between(env.x, env.lo, env.hi, step="post", color=color, alpha=0.3, linewidth=0.6, label=label)
    return True


def _hold_limit(steps: np.ndarray, width: int) -> int:
    """How many bins past its last save a series keeps its value: its usual save interval."""
    if len(steps) < 2:
        return 0
    return int(np.median(np.diff(np.unique(steps)))) // width


def color_norm(matrix: np.ndarray, log: Optional[bool] = None):
    """A matplotlib norm for ``matrix``: logarithmic when ``log`` or (None) when its finite
    values are positive and span at least :data:`LOG_SPAN`; and whether it is logarithmic."""
    from matplotlib.colors import LogNorm, Normalize

    finite = matrix[np.isfinite(matrix)]
    if not len(finite):
        return Normalize(0, 1), False
    lo, hi = float(finite.min()), float(finite.max())
    positive = finite[finite > 0]
    if log is None:
        log = lo > 0 and hi / lo >= LOG_SPAN
    if log and len(positive):
        return LogNorm(float(positive.min()), max(float(positive.max()), float(positive.min()) * 1.0001)), True
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return Normalize(lo, hi), False


def draw_heatmap(ax, binned: Binned, label: str = "value", log: Optional[bool] = None, cmap: str = "viridis",
                 xlabel: str = "global step", max_row_labels: int = 250):
    """Draw ``binned`` on ``ax`` (rows top to bottom in their order) with a colour bar; returns the image."""
    from matplotlib.colors import ListedColormap

    matrix = binned.matrix
    norm, is_log = color_norm(matrix, log)
    shown = np.where(is_log & (matrix <= 0), np.nan, matrix) if is_log else matrix
    extent = (binned.edges[0] - 0.5, binned.edges[-1] - 0.5, len(binned.rows) - 0.5, -0.5)
    ax.set_facecolor("#eeeeee")  # no value yet
    image = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest", norm=norm,
                      cmap=cmap, extent=extent)
    if binned.nonfinite.any():
        ax.imshow(np.ma.masked_where(~binned.nonfinite, np.ones(matrix.shape)), aspect="auto",
                  interpolation="nearest", cmap=ListedColormap([NONFINITE_COLOR]), extent=extent)
    rows = len(binned.rows)
    every = max(1, int(np.ceil(rows / max_row_labels)))
    ticks = list(range(0, rows, every))
    labels, _ = shorten_labels(binned.rows)
    ax.set_yticks(ticks)
    ax.set_yticklabels([labels[i] for i in ticks], fontsize=9 if rows <= 40 else 7 if rows <= 120 else 6)
    ax.set_xlabel(xlabel)
    width = binned.width
    if width > 1:
        # A text, not a title: a title's placement measures every tick label (slow at 200 rows).
        ax.text(1.0, 1.01, f"bins of {width} steps, each its {binned.shows}", fontsize=8, ha="right", va="bottom",
                transform=ax.transAxes)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    colorbar.set_label(label + (" (log scale)" if is_log else ""))
    return image


def fixed_layout(fig, row_labels: Sequence[str], fontsize: float = 7) -> None:
    """Margins for a one-heatmap figure from its row labels' length, so that saving needs
    no tight bounding box (which lays every label out twice more); call it before drawing
    (the colour bar takes its place from the axes)."""
    width, height = fig.get_size_inches()
    left = 0.25 + 0.6 * fontsize / 72 * max((len(t) for t in row_labels), default=4)
    fig.subplots_adjust(left=min(0.5, left / width), right=1 - 0.75 / width, bottom=min(0.4, 0.6 / height),
                        top=1 - min(0.3, 0.35 / height))


def heatmap_height(rows: int) -> float:
    """Figure height in inches for a heatmap of ``rows`` rows (each row stays legible)."""
    return max(2.2, 1.1 + rows * (0.16 if rows <= 40 else 0.13 if rows <= 120 else 0.11))


def png_data_uri(fig, dpi: int = 80, tight: bool = True) -> str:
    """A matplotlib figure as a ``data:image/png;base64,...`` URI (no metadata, no network)."""
    import base64
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None}, bbox_inches="tight" if tight else None)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def new_figure(width: float, height: float, dpi: int = 80):
    """A matplotlib Figure drawn off screen (no pyplot state, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def sparkline(steps: np.ndarray, values: np.ndarray, label: str) -> str:
    """A small line of ``values`` over ``steps`` (a notebook summary's loss) as a data URI."""
    fig = new_figure(3.2, 0.9)
    ax = fig.add_subplot()
    ax.plot(steps, values, linewidth=1, color="#1f77b4")
    finite = values[np.isfinite(values)]
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() >= LOG_SPAN:
        ax.set_yscale("log")
    ax.set_title(label, fontsize=7, loc="left")
    ax.tick_params(labelsize=6, length=2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return png_data_uri(fig)


def small_heatmap(series: Sequence[Tuple[str, np.ndarray, np.ndarray]], label: str) -> str:
    """A small heatmap (rows: series in natural order, at most 120 step bins) as a data URI."""
    ordered = sorted(series, key=lambda item: natural_key(item[0]))
    binned = bin_series(ordered, max_bins=120)
    fig = new_figure(4.4, min(4.0, 0.9 + 0.1 * len(ordered)))
    ax = fig.add_subplot()
    image = draw_heatmap(ax, binned, label, max_row_labels=30)
    ax.tick_params(labelsize=6)
    ax.xaxis.label.set_size(7)
    ax.title.set_size(6)
    image.colorbar.ax.tick_params(labelsize=6)
    image.colorbar.ax.yaxis.label.set_size(7)
    return png_data_uri(fig)

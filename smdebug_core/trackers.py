"""W&B and MLflow as destinations of a run's values: what the hook's tracker sinks
(:mod:`smdebug.sinks`) and ``smdebug export RUN --to wandb|mlflow`` both send.

A step's values are :class:`StepPoints`: its scalars (losses, metrics, ``save_scalar``), each
keeping its name and step, and its per-layer statistics (the reductions of the chosen
collections), grouped by statistic. Both tools freeze on thousands of per-layer series
(wandb#4759, mlflow#1571), so statistics are not one series per layer by default:

* **W&B**: one object per statistic and step, under ``smdebug/reductions/<statistic>``: a
  ``wandb.Histogram`` of the layers' values (the default) or a ``wandb.Table`` (columns
  ``tensor``, ``value``; ``grouped="table"``: the layers' names kept, about 2x the cost of a
  histogram for the training loop, docs/performance.md). Every value is logged with ``smdebug/step``, the
  hook's global step, which the run's charts use as their x axis (``define_metric``), so your
  own ``wandb.log`` calls and ours never fight over wandb's ``_step``.
* **MLflow** has no grouped object: each statistic of each tensor is a metric named by its
  record, ``smdebug/reductions/<statistic>/<tensor>``, for the first ``max_series`` (200 by
  default) such series; the rest are dropped with one warning (counted).

Scalars of TRAIN and GLOBAL steps keep their name; those of other modes get ``_EVAL``,
``_PREDICT``... appended (SageMaker's metric lines do the same), so a series never mixes modes.
Each tool reads its own settings (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``;
``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_DIR``...): smdebug has none of its own.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .logger import get_logger
from .reduction_config import REDUCTION_TAG_PREFIX, parse_reduction_tag, reduction_label

logger = get_logger()

#: Per-layer series sent to MLflow at most (statistics x tensors); the rest are dropped.
MLFLOW_MAX_SERIES = 200
#: MLflow's log_batch takes at most 1,000 metrics a call.
MLFLOW_BATCH = 1000
STEP_KEY = "smdebug/step"
#: Bins of a grouped statistic's W&B histogram (few layers need more; each bin costs serialization).
HISTOGRAM_BINS = 32
GROUPED_PREFIX = REDUCTION_TAG_PREFIX  # smdebug/reductions/


def require(tool: str):
    """The tool's module, or an ImportError naming the extra that installs it."""
    try:
        if tool == "wandb":
            import wandb

            return wandb
        import mlflow

        return mlflow
    except ImportError as exc:
        raise ImportError(f"sending smdebug's values to {'W&B' if tool == 'wandb' else 'MLflow'} needs the {tool} "
                          f"package: pip install 'smdebug-core[{tool}]' (or pip install {tool}); {exc}") from None


class LayerValues(NamedTuple):
    """One statistic of many tensors at a step: ``values[i]`` is that of ``tensors[i]``."""

    tensors: Tuple[str, ...]
    values: np.ndarray

    def pairs(self):
        return zip(self.tensors, self.values.tolist())


@dataclass
class StepPoints:
    """One step's values: ``scalars`` ``(name, value)``; ``stats``: statistic -> :class:`LayerValues`."""

    step: int
    mode: str = "TRAIN"
    scalars: List[Tuple[str, float]] = field(default_factory=list)
    stats: Dict[str, LayerValues] = field(default_factory=dict)
    arrived: float = 0.0  # time.monotonic() when the hook handed the step over (0: not from a hook)

    def __len__(self):
        return len(self.scalars) + sum(len(v.tensors) for v in self.stats.values())

    def add_stats(self, stat: str, tensors: Sequence[str], values) -> None:
        """Add ``values`` of ``tensors`` to statistic ``stat`` (after those it has)."""
        had = self.stats.get(stat)
        values = np.asarray(values, dtype=np.float64)
        if had is not None:
            tensors, values = had.tensors + tuple(tensors), np.concatenate([had.values, values])
        self.stats[stat] = LayerValues(tuple(tensors), values)


def scalar_name(name: str, mode: str) -> str:
    """A scalar's series: its name, with ``_<MODE>`` for modes other than TRAIN and GLOBAL."""
    return name if mode in ("TRAIN", "GLOBAL") else f"{name}_{mode}"


class TagParser:
    """Reduction record names -> ``(statistic, tensor)``, cached (the same tags every step)."""

    def __init__(self):
        self._cache: Dict[str, Optional[Tuple[str, str]]] = {}
        self._groups: Dict[tuple, list] = {}

    def groups(self, tags: Sequence[str]) -> List[Tuple[str, Tuple[str, ...], np.ndarray]]:
        """A list of tags (a batch of reductions, the same every step) as ``(statistic,
        tensors, positions)``: parsed once per list, so a step costs a few numpy takes."""
        key = tuple(tags)
        found = self._groups.get(key)
        if found is None:
            by_stat: Dict[str, Tuple[List[str], List[int]]] = {}
            for i, tag in enumerate(key):
                parsed = self(tag)
                if parsed is not None:
                    names, positions = by_stat.setdefault(parsed[0], ([], []))
                    names.append(parsed[1])
                    positions.append(i)
            if len(self._groups) > 256:  # lists that keep changing: bound the cache
                self._groups.clear()
            found = self._groups[key] = [(stat, tuple(names), np.asarray(positions, dtype=np.int64))
                                         for stat, (names, positions) in by_stat.items()]
        return found

    def __call__(self, tag: str) -> Optional[Tuple[str, str]]:
        try:
            return self._cache[tag]
        except KeyError:
            parsed = parse_reduction_tag(tag)
            out = None if parsed is None else (reduction_label(parsed[0], parsed[1]), parsed[2])
            self._cache[tag] = out
            return out


# --------------------------------------------------------------------------- MLflow
_MLFLOW_BAD = re.compile(r"[^\w\-. /]")


def mlflow_key(name: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_-. /``; others become ``_``)."""
    key = _MLFLOW_BAD.sub("_", name).replace("..", "_.").strip("/") or "_"
    return key


class MlflowDestination:
    """Sends :class:`StepPoints` to one MLflow run with ``MlflowClient.log_batch`` (at most
    1,000 metrics a call). ``run_id``: that run; default: the active run, else a run created
    (on first use, in the caller's thread) in ``$MLFLOW_EXPERIMENT_NAME``/``_ID`` or the
    default experiment, ended by :meth:`close`."""

    def __init__(self, run_id: Optional[str] = None, max_series: int = MLFLOW_MAX_SERIES, run_name: Optional[str] = None):
        mlflow = require("mlflow")
        self.max_series = int(max_series)
        self.run_name = run_name
        if run_id is None:
            active = mlflow.active_run()  # local: no call to the server on the training thread
            run_id = active.info.run_id if active is not None else None
        self.run_id = run_id
        self._created = False
        self._client = None
        self._series: set = set()
        self.dropped_series: set = set()

    def open(self) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient()
        if self.run_id is None:
            self.run_id = self._client.create_run(self._experiment_id(), run_name=self.run_name).info.run_id
            self._created = True

    def _experiment_id(self) -> str:
        exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if exp_id:
            return exp_id
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"
        found = self._client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else self._client.create_experiment(name)

    def send(self, batch: Sequence[StepPoints]) -> int:
        """Logs the batch; returns how many points were left out (over the series cap)."""
        from mlflow.entities import Metric

        if self._client is None:
            self.open()
        now = int(time.time() * 1000)
        metrics, left_out = [], 0
        for points in batch:
            for name, value in points.scalars:
                metrics.append(Metric(mlflow_key(scalar_name(name, points.mode)), float(value), now, points.step))
            for stat, layers in points.stats.items():
                for tensor, value in layers.pairs():
                    key = mlflow_key(scalar_name(f"{GROUPED_PREFIX}{stat}/{tensor}", points.mode))
                    if key not in self._series:
                        if len(self._series) >= self.max_series:
                            if not self.dropped_series:
                                logger.warning(
                                    "smdebug: MLflow gets at most %d per-layer series (max_series); %s and the "
                                    "series after it are not sent (warned once; the run's files have them all)",
                                    self.max_series, key)
                            self.dropped_series.add(key)
                            left_out += 1
                            continue
                        self._series.add(key)
                    metrics.append(Metric(key, float(value), now, points.step))
        for start in range(0, len(metrics), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start:start + MLFLOW_BATCH])
        return left_out

    def close(self) -> None:
        if self._created and self._client is not None:
            self._client.set_terminated(self.run_id)


# --------------------------------------------------------------------------- W&B
class WandbDestination:
    """Sends :class:`StepPoints` to a W&B run: the active one (``wandb.run``), else one started
    with ``wandb.init()`` on first use (its settings from W&B's own environment variables),
    finished by :meth:`close`. ``grouped``: ``"table"`` or ``"histogram"`` per statistic and
    step; ``"series"``: one series per layer (what the W&B docs advise against past ~10k)."""

    #: wandb's own threads' CPU per unit of the sender's, for a row (measured: about 2x).
    helper_cost = 2.0

    def __init__(self, grouped: str = "histogram", run=None, init_kwargs: Optional[dict] = None):
        if grouped not in ("table", "histogram", "series"):
            raise ValueError(f"grouped must be 'table', 'histogram' or 'series', got {grouped!r}")
        wandb = require("wandb")
        self.grouped = grouped
        self.run = run if run is not None else wandb.run
        self._init_kwargs = init_kwargs or {}
        self._started = False
        self._defined: set = set()
        self.dropped_series: set = set()

    def open(self) -> None:
        if self.run is None:
            import wandb

            self.run = wandb.init(**self._init_kwargs)
            self._started = True
        self.run.define_metric(STEP_KEY)

    def _define(self, key: str) -> None:
        if key not in self._defined:
            self._defined.add(key)
            self.run.define_metric(key, step_metric=STEP_KEY)

    def send(self, batch: Sequence[StepPoints]) -> int:
        import wandb

        if STEP_KEY not in self._defined:
            self.open()
            self._defined.add(STEP_KEY)
        for points in batch:
            row: dict = {STEP_KEY: points.step}
            for name, value in points.scalars:
                row[scalar_name(name, points.mode)] = float(value)
            for stat, layers in points.stats.items():
                key = scalar_name(f"{GROUPED_PREFIX}{stat}", points.mode)
                if self.grouped == "table":
                    row[key] = wandb.Table(columns=["tensor", "value"], data=[list(p) for p in layers.pairs()])
                elif self.grouped == "histogram":
                    finite = layers.values[np.isfinite(layers.values)]
                    if finite.size:
                        row[key] = wandb.Histogram(np_histogram=histogram(finite))
                else:
                    row.update((f"{key}/{t}", v) for t, v in layers.pairs())
            for key in row:
                if key != STEP_KEY:
                    self._define(key)
            self.run.log(row)
        return 0

    def close(self) -> None:
        if self._started and self.run is not None:
            self.run.finish()


def make_destination(to: str, **kwargs):
    if to == "wandb":
        return WandbDestination(**kwargs)
    if to == "mlflow":
        return MlflowDestination(**kwargs)
    raise ValueError(f"unknown tracker {to!r}: 'wandb' or 'mlflow'")


def histogram(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> Tuple[list, list]:
    """``np.histogram``'s counts and edges of finite ``values``, by one ``bincount`` (numpy's
    own costs ~80 us for a few hundred values, mostly its checks)."""
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return [int(values.size)], [low, low + 1.0]
    positions = ((values - low) * (bins / (high - low))).astype(np.int64)
    counts = np.bincount(np.minimum(positions, bins - 1), minlength=bins)
    return counts.tolist(), np.linspace(low, high, bins + 1).tolist()


# --------------------------------------------------------------------------- downsampling
def extreme_bins(steps: np.ndarray, values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of the points to keep so that at most ``max_points`` remain (``steps`` sorted):
    the steps cut into ``max_points // 2`` bins, each keeping its minimum and its maximum
    (and its first non-finite value, which a plot must not lose)."""
    n = len(steps)
    if n <= max_points:
        return np.arange(n)
    bins = max(1, max_points // 2)
    edges = np.linspace(0, n, bins + 1).astype(np.int64)
    keep = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        part = values[lo:hi]
        finite = np.isfinite(part)
        if finite.any():
            masked_lo = np.where(finite, part, np.inf)
            masked_hi = np.where(finite, part, -np.inf)
            keep += [lo + int(np.argmin(masked_lo)), lo + int(np.argmax(masked_hi))]
        if not finite.all():
            keep.append(lo + int(np.argmin(finite)))
    return np.unique(np.asarray(keep, dtype=np.int64))

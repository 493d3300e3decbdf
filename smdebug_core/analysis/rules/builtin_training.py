"""Built-in rules about the course of training: losses, over-fitting, labels, stalls.

Parameter names and defaults follow the public SageMaker Debugger built-in rules reference
("List of Debugger built-in rules", docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html).

Loss series. The loss rules read the ``losses`` collection (or ``tensor_regex``); for runs
without one (XGBoost saves its metrics in ``metrics``), the metrics that are not scores
(auc, map, ndcg, accuracy, ...) stand in. Training and validation values are told apart
by mode (a loss saved in EVAL steps is a validation loss) or by name: ``val_loss`` pairs
with ``loss`` (Keras), ``validation-rmse`` with ``train-rmse`` (XGBoost).
"""
from __future__ import annotations

import functools
import re
from collections import deque
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...exceptions import ConfigError
from ...modes import ModeKeys
from . import _params as P
from .actions import StopTraining, stops_training
from .culprit import culprit
from .early_stopping import RunEarlyStopping, handled_message, monitored_series
from .rule import DATA_MISSING, Rule
from .views import Required, StepView

_SCORE_METRIC = re.compile(r"(auc|aucpr|map|ndcg|acc|accuracy|precision|recall|f1|pre|r2)(@.*)?$", re.IGNORECASE)
_VAL_PREFIX = re.compile(r"^(val|valid|validation|eval|test)_", re.IGNORECASE)
_TRAIN_DATASETS = ("train", "training")
_VAL_DATASETS = ("val", "valid", "validation", "eval", "evaluation", "test")
TRAIN, VAL = "train", "validation"


def loss_names(view: StepView, collection_names=(), tensor_regex=(), use_losses_collection: bool = True) -> List[str]:
    """The loss-like tensors of a step (see the module docstring)."""
    if collection_names or tensor_regex:
        names = set(view.tensor_names(collection_names, tensor_regex))
        if use_losses_collection:
            names.update(view.tensor_names("losses"))
        return sorted(names)
    if not use_losses_collection:
        return []
    names = view.tensor_names("losses")
    if names:
        return names
    return [n for n in view.tensor_names("metrics") if not _SCORE_METRIC.search(n.rpartition("-")[2])]


#: A validation loss a trainer logged (Lightning's ``self.log("val_loss", ...)``, the Hugging
#: Face Trainer's ``eval_loss``): saved as a scalar, outside the losses collection.
LOGGED_VALIDATION_LOSS = r"^scalar/(val|valid|validation|eval|test)_loss$"


def with_monitored(view: StepView, names: List[str], monitor: Optional[str], logged: bool = True) -> List[str]:
    """``names``, the metric early stopping monitored (any saved tensor: it is the metric to
    judge) and, with ``logged``, the validation losses the trainer logged, where this step saved them."""
    patterns = ([LOGGED_VALIDATION_LOSS] if logged else []) + \
        ([f"^{re.escape(monitor)}$"] if monitor is not None and monitor not in names else [])
    if not patterns:
        return names
    return list(names) + [n for n in view.tensor_names((), patterns) if n not in names]


def monitored_requirements(monitor: Optional[str], logged: bool = True) -> List[Required]:
    return list(_monitored_requirements(monitor, bool(logged)))


@functools.lru_cache(maxsize=64)  # asked at every step with the same arguments; Required is immutable
def _monitored_requirements(monitor: Optional[str], logged: bool) -> Tuple[Required, ...]:
    return tuple(([Required(names=(monitor,), value=True)] if monitor is not None else []) +
                 ([Required(regex=(LOGGED_VALIDATION_LOSS,), value=True)] if logged else []))


def loss_requirements(collection_names=(), tensor_regex=(), use_losses_collection: bool = True) -> List[Required]:
    as_key = lambda items: (items,) if isinstance(items, str) else tuple(items or ())  # noqa: E731
    return list(_loss_requirements(as_key(collection_names), as_key(tensor_regex), bool(use_losses_collection)))


@functools.lru_cache(maxsize=64)
def _loss_requirements(collection_names: tuple, tensor_regex: tuple, use_losses_collection: bool
                       ) -> Tuple[Required, ...]:
    wanted = [Required(collections=collection_names, regex=tensor_regex, value=True)]
    if use_losses_collection:
        wanted.append(Required(collections=("losses", "metrics"), value=True))
    return tuple(wanted)


def series_of(name: str, mode: ModeKeys) -> Optional[Tuple[str, str]]:
    """``(series key, TRAIN or VAL)`` of a loss value, or None (PREDICT steps)."""
    if mode is ModeKeys.PREDICT:
        return None
    prefix, sep, last = name.rpartition("/")
    if prefix == "scalar":  # the namespace of logged scalars: scalar/val_loss pairs with loss
        prefix = sep = ""
    match = _VAL_PREFIX.match(last)
    if match:
        return prefix + sep + last[match.end():], VAL
    dataset, dash, metric = last.partition("-")
    if dash and metric:
        lowered = dataset.lower()
        if lowered in _TRAIN_DATASETS:
            return prefix + sep + metric, VAL if mode is ModeKeys.EVAL else TRAIN
        if lowered.startswith(_VAL_DATASETS):
            return prefix + sep + metric, VAL
    return prefix + sep + last, VAL if mode is ModeKeys.EVAL else TRAIN


def _read_losses(rule: Rule, names: List[str]) -> Dict[str, float]:
    out = {}
    for name in rule.reads(names):
        try:
            out[name] = rule.view.scalar(name)
        except DATA_MISSING:
            rule.unavailable()
    return out


_LOOK_UP = object()


class _LossRule(Rule):
    """What the loss rules share: the ``follow_early_stopping`` parameter and the run's
    early-stopping record it reads (:mod:`.early_stopping`), and the note of no losses."""

    _stopping: RunEarlyStopping

    def _follow_early_stopping(self, value) -> None:
        self.follow_early_stopping = P.boolean(self.rule_name, "follow_early_stopping", value)
        self._stopping = RunEarlyStopping(self.follow_early_stopping)

    def _handled(self, message: str, step: int, record=_LOOK_UP) -> bool:
        """Whether early stopping dealt with the finding ``message`` (then reported as handled);
        ``record``: the run's early-stopping record, when the caller read it already."""
        record = self._stopping.record(self.view) if record is _LOOK_UP else record
        handled = handled_message(record, step) if record is not None else None
        if handled is not None:
            self.handled(f"{message}; {handled}")
        return handled is not None

    def _warn_no_losses(self, names) -> None:
        if not names:
            self.no_data("step %d has no loss tensors (no 'losses' collection, nothing matched)",
                           self.view.step)


class _RegexLossRule(_LossRule):
    """A loss rule that picks its losses by ``tensor_regex`` alone (default: the losses
    collection). With ``follow_early_stopping`` and a run that recorded its early stopping,
    it judges the series early stopping monitored and reports a finding that early stopping
    ended in time as handled (:mod:`.early_stopping`)."""

    tensor_regex: list
    _monitored_seen = False

    def required_tensors(self, step):
        monitor = monitored_series(self._stopping.record(self.view))
        return loss_requirements((), self.tensor_regex, not self.tensor_regex) + \
            monitored_requirements(monitor, logged=not self.tensor_regex)

    def _loss_series(self):
        """``(series key, (training values, validation values))`` of this step's losses."""
        monitor = monitored_series(self._stopping.record(self.view))
        names = with_monitored(self.view, loss_names(self.view, (), self.tensor_regex, not self.tensor_regex), monitor,
                               logged=not self.tensor_regex)
        self._warn_no_losses(names)
        series = _split_by_series(self.view, _read_losses(self, names))
        followed = series_of(monitor, ModeKeys.TRAIN) if monitor is not None else None
        # Only a validation metric is followed: these rules judge validation, which an early
        # stopping on a training metric (a misconfiguration) does not watch.
        if followed is not None and followed[1] == VAL:
            key = followed[0]
            if key in series:
                self._monitored_seen = True
                return [(key, series[key])]
            if self._monitored_seen:
                return []
        return series.items()


class _PhaseWindows:
    """Training and validation values of one series, grouped in phases (see Overfit)."""

    __slots__ = ("train", "val", "last")

    def __init__(self):
        self.train: List[float] = []
        self.val: List[float] = []
        self.last: Optional[str] = None  # what the previous step had: "train", "val" or "both"

    def update(self, train: List[float], val: List[float]) -> None:
        if train:
            if self.last in ("val", "both"):
                self.train = []  # a new training phase begins
            self.train.extend(train)
        if val:
            if self.last in (None, "train", "both"):
                self.val = []  # a new evaluation phase begins
            self.val.extend(val)
        if train or val:
            self.last = "both" if train and val else "train" if train else "val"


def _split_by_series(view: StepView, values: Dict[str, float]) -> Dict[str, Tuple[List[float], List[float]]]:
    out: Dict[str, Tuple[List[float], List[float]]] = {}
    for name, value in values.items():
        series = series_of(name, view.mode)
        if series is None or not np.isfinite(value):
            continue
        key, kind = series
        train, val = out.setdefault(key, ([], []))
        (train if kind == TRAIN else val).append(value)
    return out


def _finished_pass(windows: "_PhaseWindows", train: List[float], val: List[float]) -> Optional[Tuple[float, float]]:
    """Update ``windows`` with a step's values; ``(training mean, validation mean)`` of the
    evaluation pass this step completes, or None.

    A pass is complete when training values follow validation values, or at once for a step
    that has both (Keras logs ``val_loss`` with ``loss`` at the end of an epoch)."""
    done = None
    if train and not val and windows.last == "val" and windows.val and windows.train:
        done = (float(np.mean(windows.train)), float(np.mean(windows.val)))
    windows.update(train, val)
    if train and val:
        done = (float(np.mean(train)), float(np.mean(val)))
    return done


class Overfit(_RegexLossRule):
    """Fires when the validation loss pulls away from the training loss.

    Judged once per complete evaluation pass (the mean of a run of consecutive validation
    values, against the mean of the training phase before it): ratio = (validation -
    training) / |training|. A pass is over-fitted when the ratio exceeds ``ratio_threshold``,
    the gap exceeds ``min_gap_fraction`` of the first training loss (an absolute floor on the
    run's own scale: 0.0055 vs 0.0042 is no gap worth a warning), the gap has widened by that
    floor since its narrowest pass (a trend, not a constant offset between two data sets) and
    the validation loss has risen above its best pass by more than that floor (while it still
    improves, a gap is the usual price of fitting). The rule fires once
    ``patience`` passes in a row are over-fitted, from global step ``start_step`` on.
    Parameters (the reference's): ``tensor_regex`` (default: the losses), ``start_step`` (0),
    ``patience`` (1, in evaluation passes), ``ratio_threshold`` (0.1); ours:
    ``min_gap_fraction`` (0.05), ``follow_early_stopping`` (False; the default set: True).
    """

    reads_what = ('scalar training and validation losses (EVAL steps, val_*/validation-* names, logged '
                  'val_loss/eval_loss scalars; the metric early stopping monitored)')

    measure_name = "validation/training ratio"

    def __init__(self, base_trial=None, tensor_regex=None, start_step=0, patience=1, ratio_threshold=0.1,
                 min_gap_fraction=0.05, follow_early_stopping=False, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._follow_early_stopping(follow_early_stopping)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.start_step = P.number(self.rule_name, "start_step", start_step, minimum=0, integer=True)
        self.patience = P.number(self.rule_name, "patience", patience, minimum=1, integer=True)
        self.ratio_threshold = P.number(self.rule_name, "ratio_threshold", ratio_threshold, minimum=0)
        self.min_gap_fraction = P.number(self.rule_name, "min_gap_fraction", min_gap_fraction, minimum=0)
        self._windows: Dict[str, _PhaseWindows] = {}
        self._over: Dict[str, int] = {}
        self._first_train: Dict[str, float] = {}
        self._narrowest: Dict[str, float] = {}
        self._best_val: Dict[str, float] = {}

    def invoke_at_step(self, step):
        fired = False
        for key, (train, val) in self._loss_series():
            if train and key not in self._first_train:
                self._first_train[key] = float(np.mean(train))
            done = _finished_pass(self._windows.setdefault(key, _PhaseWindows()), train, val)
            if done is None:
                continue
            train_mean, val_mean = done
            gap = val_mean - train_mean
            floor = self.min_gap_fraction * abs(self._first_train.get(key, train_mean))
            narrowest = self._narrowest.get(key, gap)
            best_val = self._best_val.get(key, val_mean)
            self._narrowest[key] = min(narrowest, gap)
            self._best_val[key] = min(best_val, val_mean)
            ratio = gap / abs(train_mean) if train_mean else float("inf") if gap > 0 else 0.0
            overfitted = (step >= self.start_step and ratio > self.ratio_threshold and gap > floor and gap - narrowest > floor
                          and val_mean > best_val + floor)
            self.streak_start(key, overfitted)
            over = self._over.get(key, 0) + 1 if overfitted else 0
            self._over[key] = over
            message = (f"{key}: validation {val_mean:.6g} vs training {train_mean:.6g} (ratio {ratio:.3g} > "
                       f"{self.ratio_threshold:g}; the gap {gap:.3g} widened from {narrowest:.3g}, and the "
                       f"validation loss is above its best {best_val:.6g}) for {over} evaluation passes")
            if over >= self.patience and not self._handled(message, step):
                fired = True
                self.note(message, measure=ratio, culprit=culprit(key, self.streak_start(key, True),
                                                         why="the first over-fitted evaluation pass"),
                          **{key: {"train_mean": train_mean, "validation_mean": val_mean,
                                   "ratio": ratio, "gap": gap, "narrowest_gap": narrowest}})
        return fired


class Overtraining(_RegexLossRule):
    """Fires when training goes on while the validation loss has stopped improving and rises.

    It needs validation losses (EVAL steps, or ``val_*``/``validation-*`` names): without
    them it cannot tell over-training from convergence, says so, and counts every step as one
    without data. Validation values are judged per evaluation pass (the mean of a run of
    consecutive validation values, complete when training values follow). A pass improves on
    the best pass so far when it is lower by more than the smaller of ``delta`` (absolute) and
    ``delta_relative`` times the best. The rule fires once ``patience_validation`` passes in
    a row have not improved and the latest pass is above the best by more than
    ``rise_fraction`` of the progress the validation loss had made (first pass - best), so
    that a converged validation loss, flat within its noise, does not fire.

    From the SageMaker reference: ``patience_train`` (5; accepted, no longer fires the rule
    alone: a flat training loss is what convergence looks like), ``patience_validation``
    (10, now counted in evaluation passes, not in eval batches), ``delta`` (0.1). Ours:
    ``delta_relative`` (0.01), ``rise_fraction`` (0.1; 0 fires on any plateau of
    ``patience_validation`` passes), ``tensor_regex`` (default: the losses),
    ``follow_early_stopping`` (False; the default set: True).
    """

    reads_what = ('scalar validation losses (EVAL steps, val_*/validation-* names, logged val_loss/eval_loss '
                  'scalars; the metric early stopping monitored)')

    measure_name = "evaluation passes without improvement"

    def __init__(self, base_trial=None, patience_train=5, patience_validation=10, delta=0.1, tensor_regex=None,
                 delta_relative=0.01, rise_fraction=0.1, follow_early_stopping=False, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._follow_early_stopping(follow_early_stopping)
        self.patience_train = P.number(self.rule_name, "patience_train", patience_train, minimum=1, integer=True)
        self.patience_validation = P.number(self.rule_name, "patience_validation", patience_validation, minimum=1,
                                            integer=True)
        self.delta = P.number(self.rule_name, "delta", delta, minimum=0)
        self.delta_relative = None if delta_relative is None else \
            P.number(self.rule_name, "delta_relative", delta_relative, minimum=0)
        self.rise_fraction = P.number(self.rule_name, "rise_fraction", rise_fraction, minimum=0)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self._windows: Dict[str, _PhaseWindows] = {}
        # series -> [first pass, best pass, step of best, passes since best]
        self._passes: Dict[str, list] = {}
        self._seen_validation = False

    def invoke_at_step(self, step):
        fired = False
        for key, (train, val) in self._loss_series():
            done = _finished_pass(self._windows.setdefault(key, _PhaseWindows()), train, val)
            if val:
                self._seen_validation = True
            if done is not None:
                fired |= self._judge_pass(key, done[1], step)
        if not self._seen_validation:
            self.no_data("no validation loss (EVAL steps or val_*/validation-* names): Overtraining cannot "
                         "tell over-training from convergence without it")
        return fired

    def _judge_pass(self, key: str, value: float, step: int) -> bool:
        state = self._passes.get(key)
        if state is None:
            self._passes[key] = [value, value, step, 0]
            return False
        first, best, best_step, waited = state
        if value < best - self._min_improvement(best):
            self._passes[key] = [first, value, step, 0]
            return False
        waited += 1
        state[3] = waited
        rise = value - best
        if waited < self.patience_validation or (self.rise_fraction > 0 and
                                                    rise <= self.rise_fraction * max(first - best, 0.0)):
            return False
        message = (f"validation {key} has not improved on its best ({best:.6g}, at step {best_step}) for {waited} "
                   f"evaluation passes and rose to {value:.6g}")
        if self._handled(message, step):
            return False
        self.note(message, measure=waited,
                  culprit=culprit(key, best_step, why="its best evaluation pass; no better one since"),
                  **{f"validation:{key}": {"best": best, "best_step": best_step, "latest": value,
                                           "passes": waited}})
        return True

    def _min_improvement(self, best: float) -> float:
        if self.delta_relative is None:
            return self.delta
        return min(self.delta, self.delta_relative * abs(best))


class ClassImbalance(Rule):
    """Fires on imbalanced classes or on classes that are mostly mispredicted.

    Accumulates labels (``labels_regex``, default ``.*labels``) and predictions
    (``predictions_regex``, default ``.*predictions``; ``argmax=True`` takes the argmax over
    the last axis, or p > 0.5 for 1-D probabilities). Once ``samples`` (500) labels have been
    seen it fires when the largest class has more than ``threshold_imbalance`` (10) times the
    samples of the smallest (class counts over the whole run). Mispredictions are judged on
    the latest ``samples`` predictions only, once twice that many were seen: a class whose
    fraction of mispredictions there exceeds ``threshold_misprediction`` (0.7) fires (the
    reference counts from step 0, so an untrained model's first guesses fire it on runs that
    end at accuracy 1.0). Needs full label and prediction tensors.
    """

    reads_what = 'the whole values of the labels (and predictions) tensors'

    def __init__(self, base_trial=None, threshold_imbalance=10, threshold_misprediction=0.7, samples=500,
                 argmax=False, labels_regex=".*labels", predictions_regex=".*predictions", actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.threshold_imbalance = P.number(self.rule_name, "threshold_imbalance", threshold_imbalance, minimum=1)
        self.threshold_misprediction = P.number(self.rule_name, "threshold_misprediction", threshold_misprediction,
                                                minimum=0, maximum=1)
        self.samples = P.number(self.rule_name, "samples", samples, minimum=1, integer=True)
        self.argmax = P.boolean(self.rule_name, "argmax", argmax)
        self.labels_regex = P.regex_list(self.rule_name, "labels_regex", labels_regex)
        self.predictions_regex = P.regex_list(self.rule_name, "predictions_regex", predictions_regex)
        if not self.labels_regex:
            raise ConfigError(f"{self.rule_name}: labels_regex must name the labels tensor")
        self._counts: Dict[int, int] = {}
        self._recent: deque = deque()  # (labels, predictions) of the latest steps, >= samples in all
        self._recent_size = 0
        self._predicted = 0  # samples with a prediction, over the run
        self._seen = 0

    def required_tensors(self, step):
        return [Required(regex=self.labels_regex, value=True), Required(regex=self.predictions_regex, value=True)]

    def _concat(self, names, what) -> List[np.ndarray]:
        parts = []
        for name in names:
            try:
                array = np.asarray(self.view.value(name))
            except DATA_MISSING:
                self.unavailable()
                continue
            if array.dtype.kind not in "biuf":
                self.warn_once(f"type-{what}", "%s tensor %s is not numeric (%s); ignored", what, name, array.dtype)
                continue
            parts.append(array)
        return parts

    def _flat(self, parts, predictions: bool) -> Optional[np.ndarray]:
        """The tensors' values as one float vector (predictions turned into class ids first)."""
        if not parts:
            return None
        out = []
        for array in parts:
            if predictions and self.argmax:
                array = array.argmax(axis=-1) if array.ndim >= 2 else (array > 0.5)
            out.append(np.asarray(array, dtype=np.float64).ravel())
        return np.concatenate(out)

    def invoke_at_step(self, step):
        view = self.view
        labels = self._flat(self._concat(view.tensor_names(regex=self.labels_regex), "labels"), False)
        if labels is None or labels.size == 0:
            self.no_data("step %d has no labels tensor matching %s", step, list(self.labels_regex))
            return False
        predictions = None
        if self.predictions_regex:
            predictions = self._flat(self._concat(view.tensor_names(regex=self.predictions_regex), "predictions"),
                                     True)
            if predictions is not None and predictions.size != labels.size:
                self.warn_once("sizes", "labels (%d values) and predictions (%d values) differ in size at step %d; "
                               "mispredictions are not counted", labels.size, predictions.size, step)
                predictions = None
        keep = np.isfinite(labels) if predictions is None else np.isfinite(labels) & np.isfinite(predictions)
        labels = np.rint(labels[keep]).astype(np.int64)
        if predictions is not None:
            predictions = np.rint(predictions[keep]).astype(np.int64)
        classes, counts = np.unique(labels, return_counts=True)
        for c, n in zip(classes.tolist(), counts.tolist()):
            self._counts[c] = self._counts.get(c, 0) + n
        if predictions is not None:
            self._recent.append((labels, predictions))
            self._recent_size += labels.size
            self._predicted += labels.size
            while self._recent_size - self._recent[0][0].size >= self.samples:
                self._recent_size -= self._recent.popleft()[0].size
        self._seen += labels.size
        if self._seen < self.samples or not self._counts:
            return False
        fired = False
        smallest = min(self._counts.items(), key=lambda kv: kv[1])
        largest = max(self._counts.items(), key=lambda kv: kv[1])
        ratio = largest[1] / smallest[1]
        if len(self._counts) >= 2 and ratio > self.threshold_imbalance:
            fired = True
            self.note(f"class {largest[0]} has {ratio:.3g}x the samples of class {smallest[0]} "
                      f"({largest[1]} vs {smallest[1]}; > {self.threshold_imbalance:g})",
                      class_counts={str(k): v for k, v in sorted(self._counts.items())})
        if self._recent and self._predicted >= 2 * self.samples:
            recent_labels = np.concatenate([lab for lab, _ in self._recent])
            recent_wrong = recent_labels[np.concatenate([pred for _, pred in self._recent]) != recent_labels]
            judged = dict(zip(*[a.tolist() for a in np.unique(recent_labels, return_counts=True)]))
            wrong = dict(zip(*[a.tolist() for a in np.unique(recent_wrong, return_counts=True)]))
            bad = {c: wrong.get(c, 0) / n for c, n in judged.items()
                   if wrong.get(c, 0) / n > self.threshold_misprediction}
            if bad:
                fired = True
                shown = ", ".join(f"class {c}: {f:.0%}" for c, f in sorted(bad.items())[:5])
                self.note(f"classes mispredicted more than {self.threshold_misprediction:.0%} of the time in the "
                          f"latest {recent_labels.size} samples: {shown}",
                          misprediction_fraction={str(c): f for c, f in sorted(bad.items())})
        return fired


class StalledTrainingRule(Rule):
    """Fires when no new step has been saved for ``threshold`` seconds.

    Checked while the evaluation waits for new steps (``invoke_rule`` following a running
    job, or a live rule's evaluation thread); fires once per stall. Parameters:
    ``threshold`` (1800 s), ``stop_training_on_fire`` (False; True adds a StopTraining
    action), ``training_job_name_prefix`` (accepted for compatibility; SageMaker job lookup
    does not apply here, StopTraining acts on the run being watched).
    """

    reads_what = 'no tensor: the times steps were saved at'

    def __init__(self, base_trial=None, threshold=1800, stop_training_on_fire=False, training_job_name_prefix=None,
                 actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.threshold = P.number(self.rule_name, "threshold", threshold, minimum=0, exclusive_minimum=True)
        self.stop_training_on_fire = P.boolean(self.rule_name, "stop_training_on_fire", stop_training_on_fire)
        if training_job_name_prefix is not None and not isinstance(training_job_name_prefix, str):
            raise ConfigError(f"{self.rule_name}: training_job_name_prefix must be a string, got "
                              f"{training_job_name_prefix!r}")
        self.training_job_name_prefix = training_job_name_prefix
        if self.stop_training_on_fire and not stops_training(self.actions):
            self.actions.append(StopTraining())
        self._fired_this_stall = False

    def invoke_at_step(self, step):
        self._fired_this_stall = False  # a new step ends any stall
        return False

    def check_idle(self, idle_seconds: float) -> bool:
        if self._fired_this_stall or idle_seconds < self.threshold:
            return False
        self._fired_this_stall = True
        self.note(f"no new step saved for {idle_seconds:.0f} s (threshold {self.threshold:g} s)",
                  idle_seconds=round(idle_seconds, 1))
        return True

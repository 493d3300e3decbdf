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

import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...exceptions import ConfigError
from ...modes import ModeKeys
from . import _params as P
from .actions import StopTraining, stops_training
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


def loss_requirements(collection_names=(), tensor_regex=(), use_losses_collection: bool = True) -> List[Required]:
    wanted = [Required(collections=collection_names, regex=tensor_regex, value=True)]
    if use_losses_collection:
        wanted.append(Required(collections=("losses", "metrics"), value=True))
    return wanted


def series_of(name: str, mode: ModeKeys) -> Optional[Tuple[str, str]]:
    """``(series key, TRAIN or VAL)`` of a loss value, or None (PREDICT steps)."""
    if mode is ModeKeys.PREDICT:
        return None
    prefix, sep, last = name.rpartition("/")
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
    return name, VAL if mode is ModeKeys.EVAL else TRAIN


def _read_losses(rule: Rule, names: List[str]) -> Dict[str, float]:
    out = {}
    for name in rule.reads(names):
        try:
            out[name] = rule.view.scalar(name)
        except DATA_MISSING:
            rule.unavailable()
    return out


class _LossRule(Rule):
    def _warn_no_losses(self, names) -> None:
        if not names:
            self.no_data("step %d has no loss tensors (no 'losses' collection, nothing matched)",
                           self.view.step)


class _RegexLossRule(_LossRule):
    """A loss rule that picks its losses by ``tensor_regex`` alone (default: the losses collection)."""

    tensor_regex: list

    def required_tensors(self, step):
        return loss_requirements((), self.tensor_regex, not self.tensor_regex)

    def _loss_series(self):
        """``(series key, (training values, validation values))`` of this step's losses."""
        names = loss_names(self.view, (), self.tensor_regex, not self.tensor_regex)
        self._warn_no_losses(names)
        return _split_by_series(self.view, _read_losses(self, names)).items()


# ---------------------------------------------------------------------------------------------
class LossNotDecreasing(_LossRule):
    """Fires when a loss has not decreased enough over a window of ``num_steps`` steps.

    As in the reference, the rule checks every ``num_steps`` steps (counted in the loss's
    mode): at the first saved step at least ``num_steps`` after the previous check, it
    compares the loss now with the loss ``num_steps`` earlier. Both sides are window means,
    so that one noisy step cannot fire it: "now" is the mean of the values saved in the
    last ``num_steps`` steps (``(check - num_steps, check]``), "earlier" the mean of the
    window before it (``(check - 2 num_steps, check - num_steps]``), or, when saving is
    sparser than that, the latest value at least ``num_steps`` back (the reference's
    point-to-point comparison). The rule fires when the loss fell by less than
    ``diff_percent`` percent of the earlier value (``diff_percent=0``: when it did not fall).
    Each mode's losses form their own series unless ``mode`` picks one.
    Parameters (the reference's): ``collection_names``, ``tensor_regex``,
    ``use_losses_collection`` (True), ``num_steps`` (10), ``diff_percent`` (0.0), ``mode``
    (None: every mode).
    """

    worst, measure_name = "min", "decrease %"

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, use_losses_collection=True,
                 num_steps=10, diff_percent=0.0, mode=None, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.collection_names = P.str_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.use_losses_collection = P.boolean(self.rule_name, "use_losses_collection", use_losses_collection)
        if not (self.collection_names or self.tensor_regex or self.use_losses_collection):
            raise ConfigError(f"{self.rule_name}: with use_losses_collection=False give collection_names or "
                              "tensor_regex (the losses to watch)")
        self.num_steps = P.number(self.rule_name, "num_steps", num_steps, minimum=1, integer=True)
        self.diff_percent = P.number(self.rule_name, "diff_percent", diff_percent, minimum=0, maximum=100)
        self.mode = P.mode(self.rule_name, "mode", mode)
        # (name, mode) -> [(mode_step, value), ...] since the reference point, and the last checked step
        self._history: Dict[Tuple[str, ModeKeys], List[Tuple[int, float]]] = {}
        self._last_check: Dict[Tuple[str, ModeKeys], int] = {}

    def required_tensors(self, step):
        if self.mode is not None and self.view.mode is not self.mode:
            return ()
        return loss_requirements(self.collection_names, self.tensor_regex, self.use_losses_collection)

    def invoke_at_step(self, step):
        view = self.view
        if self.mode is not None and view.mode is not self.mode:
            return False
        names = loss_names(view, self.collection_names, self.tensor_regex, self.use_losses_collection)
        self._warn_no_losses(names)
        now = view.mode_step
        stuck = {}
        for name, value in _read_losses(self, names).items():
            key = (name, view.mode)
            history = self._history.setdefault(key, [])
            history.append((now, value))
            last = self._last_check.setdefault(key, now)
            if now - last < self.num_steps:
                continue
            cutoff = now - self.num_steps
            earlier = [entry for entry in history if entry[0] <= cutoff]
            if not earlier:
                continue
            self._last_check[key] = now
            current = [v for s, v in history if s > cutoff]
            reference = [v for s, v in earlier if s > cutoff - self.num_steps] or [earlier[-1][1]]
            ref_steps = [s for s, _ in earlier if s > cutoff - self.num_steps] or [earlier[-1][0]]
            # What the next check needs: this window (its reference) and the newest older value.
            self._history[key] = [earlier[-1]] + [entry for entry in history if entry[0] > cutoff]
            ref, value = float(np.mean(reference)), float(np.mean(current))
            decrease = ref - value
            required = self.diff_percent / 100.0 * abs(ref)
            if decrease <= 0 or decrease < required:
                percent = 100.0 * decrease / abs(ref) if ref else 0.0
                stuck[name] = (min(ref_steps), max(ref_steps), ref, value, percent)
        for name, (first, last, ref, value, percent) in stuck.items():
            window = f"steps {first}-{last}" if first != last else f"step {first}"
            self.note(f"loss {name} ({view.mode.name}): mean {ref:.6g} over {window}, {value:.6g} over the "
                      f"{self.num_steps} steps to {now} ({percent:+.3g}%): less than the required "
                      f"{self.diff_percent:g}% decrease", measure=percent,
                      **{name: {"from_steps": [first, last], "from": ref, "to_step": now, "to": value}})
        return bool(stuck)


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


class Overfit(_RegexLossRule):
    """Fires when the validation loss exceeds the training loss by more than ``ratio_threshold``.

    At each step with validation values, ratio = (mean validation loss of the current
    evaluation phase - mean training loss of the latest training phase) / |mean training
    loss|; the rule fires once the ratio has exceeded ``ratio_threshold`` at ``patience``
    consecutive such steps from global step ``start_step`` on. Parameters: ``tensor_regex``
    (default: the losses), ``start_step`` (0), ``patience`` (1), ``ratio_threshold`` (0.1).
    """

    measure_name = "validation/training ratio"

    def __init__(self, base_trial=None, tensor_regex=None, start_step=0, patience=1, ratio_threshold=0.1,
                 actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.start_step = P.number(self.rule_name, "start_step", start_step, minimum=0, integer=True)
        self.patience = P.number(self.rule_name, "patience", patience, minimum=1, integer=True)
        self.ratio_threshold = P.number(self.rule_name, "ratio_threshold", ratio_threshold, minimum=0)
        self._windows: Dict[str, _PhaseWindows] = {}
        self._over: Dict[str, int] = {}

    def invoke_at_step(self, step):
        fired = False
        for key, (train, val) in self._loss_series():
            windows = self._windows.setdefault(key, _PhaseWindows())
            windows.update(train, val)
            if not val or not windows.train or step < self.start_step:
                continue
            train_mean, val_mean = float(np.mean(windows.train)), float(np.mean(windows.val))
            if train_mean == 0:
                continue
            ratio = (val_mean - train_mean) / abs(train_mean)
            over = self._over.get(key, 0) + 1 if ratio > self.ratio_threshold else 0
            self._over[key] = over
            if over >= self.patience:
                fired = True
                self.note(f"{key}: validation {val_mean:.6g} vs training {train_mean:.6g} "
                          f"(ratio {ratio:.3g} > {self.ratio_threshold:g} for {over} steps)", measure=ratio,
                          **{key: {"train_mean": train_mean, "validation_mean": val_mean, "ratio": ratio}})
        return fired


class Overtraining(_RegexLossRule):
    """Fires when the training or the validation loss stops improving.

    A value improves on the best so far when it is lower by more than the smaller of
    ``delta`` (absolute) and ``delta_relative`` times the best value; the rule fires once
    the training loss has not improved for ``patience_train`` of its steps, or the
    validation loss for ``patience_validation`` of its steps.

    From the SageMaker reference: ``patience_train`` (5), ``patience_validation`` (10),
    ``delta`` (0.1). Ours: ``delta_relative`` (0.01: 1% of the best value; None for the
    reference's absolute delta alone, which never sees a loss below about ``delta``
    improve and so fires on every run whose loss gets small), ``tensor_regex`` (default:
    the losses).
    """

    measure_name = "steps without improvement"

    def __init__(self, base_trial=None, patience_train=5, patience_validation=10, delta=0.1, tensor_regex=None,
                 delta_relative=0.01, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.patience_train = P.number(self.rule_name, "patience_train", patience_train, minimum=1, integer=True)
        self.patience_validation = P.number(self.rule_name, "patience_validation", patience_validation, minimum=1,
                                            integer=True)
        self.delta = P.number(self.rule_name, "delta", delta, minimum=0)
        self.delta_relative = None if delta_relative is None else \
            P.number(self.rule_name, "delta_relative", delta_relative, minimum=0)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self._best: Dict[Tuple[str, str], Tuple[float, int]] = {}

    def invoke_at_step(self, step):
        fired = False
        for key, groups in self._loss_series():
            for kind, values, patience in ((TRAIN, groups[0], self.patience_train),
                                           (VAL, groups[1], self.patience_validation)):
                if not values:
                    continue
                value = float(np.mean(values))
                best = self._best.get((key, kind))
                if best is None or value < best[0] - self._min_improvement(best[0]):
                    self._best[(key, kind)] = (value, 0)
                    continue
                waited = best[1] + 1
                self._best[(key, kind)] = (best[0], waited)
                if waited >= patience:
                    fired = True
                    self.note(f"{kind} {key} has not improved by more than {self._min_improvement(best[0]):.3g} on "
                              f"its best ({best[0]:.6g}) for {waited} steps", measure=waited,
                              **{f"{kind}:{key}": {"best": best[0], "steps": waited}})
        return fired

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
    samples of the smallest, or when a class's fraction of mispredictions exceeds
    ``threshold_misprediction`` (0.7). Needs full label and prediction tensors.
    """

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
        self._wrong: Dict[int, int] = {}
        self._judged: Dict[int, int] = {}  # samples per class that had a prediction
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
            for c, n in zip(classes.tolist(), counts.tolist()):
                self._judged[c] = self._judged.get(c, 0) + n
            wrong = labels[predictions != labels]
            for c, n in zip(*np.unique(wrong, return_counts=True)):
                self._wrong[int(c)] = self._wrong.get(int(c), 0) + int(n)
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
        if self._judged:
            bad = {c: self._wrong.get(c, 0) / n for c, n in self._judged.items()
                   if self._wrong.get(c, 0) / n > self.threshold_misprediction}
            if bad:
                fired = True
                shown = ", ".join(f"class {c}: {f:.0%}" for c, f in sorted(bad.items())[:5])
                self.note(f"classes mispredicted more than {self.threshold_misprediction:.0%} of the time: {shown}",
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

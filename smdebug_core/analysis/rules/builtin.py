"""The built-in rules, by name.

Names, parameter names and defaults are those of the public SageMaker Debugger built-in
rules reference (docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html);
each rule's docstring describes exactly what it checks here.
"""
from __future__ import annotations

import inspect
import re
from typing import Dict, List, Optional, Tuple, Type

from .builtin_activations import (
    RELU_INPUTS,
    RELU_OUTPUTS,
    TANH_SIGMOID_INPUTS,
    DeadRelu,
    PoorWeightInitialization,
    SaturatedActivation,
)
from .builtin_tensors import (
    AllZero,
    ExplodingTensor,
    SimilarAcrossRuns,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)
from .builtin_spike import LossSpike
from .builtin_loss import LossNotDecreasing
from .builtin_training import ClassImbalance, Overfit, Overtraining, StalledTrainingRule
from .builtin_xgboost import FeatureImportanceOverweight, TreeDepth
from .rule import Rule

BUILTIN_RULES: Dict[str, Type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient, ExplodingTensor, LossNotDecreasing, Overfit, Overtraining, AllZero, UnchangedTensor,
        TensorVariance, WeightUpdateRatio, PoorWeightInitialization, DeadRelu, SaturatedActivation,
        ClassImbalance, SimilarAcrossRuns, StalledTrainingRule, TreeDepth, FeatureImportanceOverweight,
        LossSpike,
    )
}

#: Rules that need a parameter without a default (a selection, a threshold, another run), or
#: only make sense while following a running job; left out when no rule list is given.
NEEDS_PARAMETERS = frozenset({"AllZero", "UnchangedTensor", "TensorVariance", "SimilarAcrossRuns",
                              "StalledTrainingRule"})


#: The trust tuning the default set gives (``smdebug rules``, the report, the corpus): rules
#: constructed in user code keep SageMaker's documented semantics; these are parameters a
#: user can pass too (docs/rules.md, "Defaults of smdebug rules").
TRUSTED_PARAMETERS: Dict[str, Dict[str, object]] = {
    "LossNotDecreasing": {"warmup_steps": 50, "stall_margin": 0.05, "converged_fraction": 0.5,
                          "follow_early_stopping": True},
    "Overfit": {"follow_early_stopping": True},
    "Overtraining": {"follow_early_stopping": True},
}


def make_rule(name: str, trial, **params) -> Rule:
    """Built-in rule ``name`` as the default set runs it: :data:`TRUSTED_PARAMETERS`, then ``params``."""
    return BUILTIN_RULES[name](trial, **{**TRUSTED_PARAMETERS.get(name, {}), **params})


def default_rule_names() -> List[str]:
    """Every built-in that works with its defaults (the candidates of :func:`choose_rules`)."""
    return [name for name in BUILTIN_RULES if name not in NEEDS_PARAMETERS]


class RunContents:
    """What a run saved, as far as choosing rules goes: its framework, the collections that
    hold saved tensors, its modes and its tensor names."""

    _XGBOOST_COLLECTIONS = {"hyperparameters", "trees", "feature_importance", "full_shap", "average_shap"}
    #: PyTorch parameter names: <RootClass>_<dotted path>.weight/.bias
    _PYTORCH_PARAMETER = re.compile(r"^(gradient/)?[A-Za-z]\w*_[\w.]*\.(weight|bias)$")

    def __init__(self, trial):
        self.names: List[str] = trial.tensor_names()
        collections = trial.collections()
        inputs = collections.get("inputs")
        if self._XGBOOST_COLLECTIONS & set(collections) or any(n.startswith("trees/") for n in self.names):
            self.framework = "XGBoost"
        elif any(self._PYTORCH_PARAMETER.match(n) for n in self.names):  # before optimizer_variables: PyTorch has it too
            self.framework = "PyTorch"
        elif "optimizer_variables" in collections:
            self.framework = "TensorFlow"
        elif inputs is not None and any("_input_" in r for r in inputs.include_regex):
            self.framework = "MXNet"
        else:  # the numpy hook, or a run whose names do not tell
            self.framework = "deep-learning"
        self.saved: Dict[str, List[str]] = {}
        for cname, coll in collections.items():
            members = [n for n in self.names if coll.matches(n)]
            if members and cname not in ("all", "default"):
                self.saved[cname] = members
        self.modes = [m.name for m in trial.modes()]
        self._trial = trial

    def matching(self, *regexes: str) -> List[str]:
        patterns = [re.compile(r) for r in regexes]
        return [n for n in self.names if any(p.search(n) for p in patterns)]

    def loss_names(self) -> List[str]:
        from .builtin_training import _SCORE_METRIC, LOGGED_VALIDATION_LOSS

        names = self.saved.get("losses") or [n for n in self.saved.get("metrics", [])
                                             if not _SCORE_METRIC.search(n.rpartition("-")[2])]
        monitor = (self._trial.early_stopping() or {}).get("monitor")
        extra = self.matching(LOGGED_VALIDATION_LOSS) + ([monitor] if monitor in self.names else [])
        return names + [n for n in extra if n not in names]  # the loss rules judge them too (with_monitored)

    def has_validation_loss(self, losses: List[str]) -> bool:
        from .builtin_training import series_of
        from ...modes import ModeKeys

        if "EVAL" in self.modes:
            return any(self._trial.tensor(n).steps(mode=ModeKeys.EVAL) for n in losses)
        return any(series_of(n, ModeKeys.TRAIN)[1] == "validation" for n in losses)


def _why_not(name: str, run: RunContents) -> Optional[str]:
    """None when rule ``name`` has something to read in ``run``, else why it is skipped."""
    xgb = run.framework == "XGBoost"
    if name == "ExplodingTensor":
        return None if run.names else "the run saved no tensors"
    if name == "LossSpike" and xgb:
        return "boosting adds trees: its training metric does not spike as a network's loss does"
    if name in ("LossNotDecreasing", "Overtraining", "Overfit", "LossSpike"):
        losses = run.loss_names()
        if not losses:
            return "no tensor in the 'losses' collection and no loss-like metric"
        if name in ("Overfit", "Overtraining") and not run.has_validation_loss(losses):
            return ("no validation loss (no EVAL steps with losses, no val_*/validation-* names)" +
                    (": it cannot tell over-training from convergence without one" if name == "Overtraining" else ""))
        return None
    if name in ("TreeDepth", "FeatureImportanceOverweight"):
        if not xgb:
            return f"reads XGBoost trees/feature importance; this is a {run.framework} run"
        collection = "trees" if name == "TreeDepth" else "feature_importance"
        return None if run.saved.get(collection) else f"the '{collection}' collection was not saved"
    if xgb and name in ("VanishingGradient", "WeightUpdateRatio", "PoorWeightInitialization", "DeadRelu",
                        "SaturatedActivation"):
        return "an XGBoost run has no gradients, weights or activations"
    if name == "VanishingGradient":
        return None if run.saved.get("gradients") else "the 'gradients' collection was not saved"
    if name == "WeightUpdateRatio":
        return None if run.saved.get("weights") else "the 'weights' collection was not saved"
    if name == "PoorWeightInitialization":
        return None if run.matching(RELU_INPUTS) else _no_activations(run, "ReLU inputs", RELU_INPUTS,
                                                                      "activation_inputs_regex")
    if name == "DeadRelu":
        return None if run.matching(RELU_OUTPUTS) else _no_activations(run, "ReLU outputs", RELU_OUTPUTS,
                                                                       "tensor_regex")
    if name == "SaturatedActivation":
        return None if run.matching(*TANH_SIGMOID_INPUTS) else \
            _no_activations(run, "tanh/sigmoid inputs", " or ".join(TANH_SIGMOID_INPUTS), "tensor_regex")
    if name == "ClassImbalance":
        return None if run.matching(r".*labels") else "no labels tensor saved (tensors matching .*labels)"
    return None


def _no_activations(run: RunContents, what: str, pattern: str, parameter: str) -> str:
    """Why an activation rule has nothing to read: none saved, or saved under names it cannot
    recognise (nn.Sequential children are named by their index: ``features.1_output_0``)."""
    modules = run.matching(r"_(input|output)_\d+$")
    if not modules:
        return f"no {what} saved (tensors matching {pattern})"
    shown = ", ".join(modules[:3]) + (" ..." if len(modules) > 3 else "")
    return (f"no {what} recognised: {len(modules)} module inputs/outputs are saved ({shown}) but none is named "
            f"like {pattern}; name the activation modules (self.relu1 = nn.ReLU()) or pass {parameter}")


def choose_rules(trial) -> Tuple[List[str], Dict[str, str], RunContents]:
    """The default rules for ``trial``: ``(chosen, {skipped: why}, what the run contains)``.

    Of the rules that work with their defaults, those with something to read in this run:
    no gradient rules for XGBoost, no tree rules for a PyTorch run, no loss rules without
    losses, and so on.
    """
    run = RunContents(trial)
    chosen, skipped = [], {}
    for name in default_rule_names():
        reason = _why_not(name, run)
        if reason is None:
            chosen.append(name)
        else:
            skipped[name] = reason
    return chosen, skipped, run


def rule_parameters(name: str) -> List[str]:
    """The parameter names a built-in rule accepts (besides base_trial, actions and name)."""
    cls = BUILTIN_RULES[name]
    skip = {"self", "base_trial", "actions", "name"}
    return [p for p in inspect.signature(cls.__init__).parameters if p not in skip]


__all__ = ["BUILTIN_RULES", "TRUSTED_PARAMETERS", "choose_rules", "make_rule", "default_rule_names", "rule_parameters", *BUILTIN_RULES]

"""The built-in rules, by name.

Names, parameter names and defaults are those of the public SageMaker Debugger built-in
rules reference (docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html);
each rule's docstring describes exactly what it checks here.
"""
from __future__ import annotations

import inspect
from typing import Dict, List, Type

from .builtin_tensors import (
    AllZero,
    DeadRelu,
    ExplodingTensor,
    PoorWeightInitialization,
    SaturatedActivation,
    SimilarAcrossRuns,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)
from .builtin_training import ClassImbalance, LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule
from .builtin_xgboost import FeatureImportanceOverweight, TreeDepth
from .rule import Rule

BUILTIN_RULES: Dict[str, Type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient, ExplodingTensor, LossNotDecreasing, Overfit, Overtraining, AllZero, UnchangedTensor,
        TensorVariance, WeightUpdateRatio, PoorWeightInitialization, DeadRelu, SaturatedActivation,
        ClassImbalance, SimilarAcrossRuns, StalledTrainingRule, TreeDepth, FeatureImportanceOverweight,
    )
}

#: Rules that need a parameter without a default (a selection, a threshold, another run), or
#: only make sense while following a running job; left out when no rule list is given.
NEEDS_PARAMETERS = frozenset({"AllZero", "UnchangedTensor", "TensorVariance", "SimilarAcrossRuns",
                              "StalledTrainingRule"})


def default_rule_names() -> List[str]:
    """The rules the CLI runs when none are named: every built-in that works with its defaults."""
    return [name for name in BUILTIN_RULES if name not in NEEDS_PARAMETERS]


def rule_parameters(name: str) -> List[str]:
    """The parameter names a built-in rule accepts (besides base_trial, actions and name)."""
    cls = BUILTIN_RULES[name]
    skip = {"self", "base_trial", "actions", "name"}
    return [p for p in inspect.signature(cls.__init__).parameters if p not in skip]


__all__ = ["BUILTIN_RULES", "default_rule_names", "rule_parameters", *BUILTIN_RULES]

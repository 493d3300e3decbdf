"""Rules: checks evaluated on the tensors of a training run, after the fact or while it trains.

* Offline / another process: ``invoke_rule(VanishingGradient(create_trial(path)))``, or the
  ``smdebug-rules`` command (``python -m smdebug.rules``).
* Live, inside training: ``hook.add_rule(ExplodingTensor(), actions=StopTraining())``.

Every rule writes a JSON report (:mod:`smdebug.rules.report`); actions
(:mod:`smdebug.rules.actions`) run when it fires.
"""
from ..exceptions import RuleEvaluationConditionMet
from .actions import Action, Callback, LogMessage, RuleEvent, StopTraining
from .builtin import (
    BUILTIN_RULES,
    AllZero,
    ClassImbalance,
    DeadRelu,
    ExplodingTensor,
    FeatureImportanceOverweight,
    LossNotDecreasing,
    Overfit,
    Overtraining,
    PoorWeightInitialization,
    SaturatedActivation,
    SimilarAcrossRuns,
    StalledTrainingRule,
    TensorVariance,
    TreeDepth,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)
from .report import RuleReport
from .rule import Rule, invoke_rule, run_rules
from .stop_protocol import StopRequestPoller, read_stop_request, write_stop_request
from .views import Required, StepView

__all__ = [
    "Action", "AllZero", "BUILTIN_RULES", "Callback", "ClassImbalance", "DeadRelu", "ExplodingTensor",
    "FeatureImportanceOverweight", "LogMessage", "LossNotDecreasing", "Overfit", "Overtraining",
    "PoorWeightInitialization", "Required", "Rule", "RuleEvaluationConditionMet", "RuleEvent", "RuleReport",
    "SaturatedActivation", "SimilarAcrossRuns", "StalledTrainingRule", "StepView", "StopRequestPoller",
    "StopTraining", "TensorVariance", "TreeDepth", "UnchangedTensor", "VanishingGradient", "WeightUpdateRatio",
    "invoke_rule", "read_stop_request", "run_rules", "write_stop_request",
]

"""Rules: checks evaluated on the tensors of a training run, after the fact or while it trains.

* Offline / another process: ``invoke_rule(VanishingGradient(create_trial(path)))``, or the
  ``smdebug-rules`` command (``python -m smdebug.rules``).
* Live, inside training: ``hook.add_rule(ExplodingTensor(), actions=StopTraining())``.

Every rule writes a JSON report (:mod:`smdebug.rules.report`); actions
(:mod:`smdebug.rules.actions`) run when it fires.

Names are loaded on first use, so that the hook can import ``smdebug.rules.stop_protocol``
without loading the rules.
"""
import importlib

from ..exceptions import RuleEvaluationConditionMet

_BUILTIN = ("AllZero", "ClassImbalance", "DeadRelu", "ExplodingTensor", "FeatureImportanceOverweight",
            "LossNotDecreasing", "Overfit", "Overtraining", "PoorWeightInitialization", "SaturatedActivation",
            "SimilarAcrossRuns", "StalledTrainingRule", "TensorVariance", "TreeDepth", "UnchangedTensor",
            "VanishingGradient", "WeightUpdateRatio")
_LAZY = {
    **{name: "builtin" for name in _BUILTIN},
    "BUILTIN_RULES": "builtin",
    "Action": "actions", "Callback": "actions", "LogMessage": "actions", "RuleEvent": "actions",
    "StopTraining": "actions", "DumpFlightRecorder": "actions",
    "RuleReport": "report",
    "Rule": "rule", "invoke_rule": "rule", "run_rules": "rule",
    "StopRequestPoller": "stop_protocol", "read_stop_request": "stop_protocol", "write_stop_request": "stop_protocol",
    "Required": "views", "StepView": "views",
    "attach_rule": "live", "LiveRule": "live",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["RuleEvaluationConditionMet", *sorted(_LAZY)]

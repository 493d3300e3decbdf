"""Rules: checks evaluated on the tensors of a training run, after the fact or while it trains.

* Offline / another process: ``invoke_rule(VanishingGradient(create_trial(path)))``, or the
  ``smdebug rules`` command.
* Live, inside training: ``hook.add_rule(ExplodingTensor(), actions=StopTraining())``.

Every rule writes a JSON report (:mod:`.report`); actions (:mod:`.actions`) run when it
fires. ``smdebug.rules`` (1.0.34's path) gives the same names.

Names are loaded on first use: ``import smdebug.rules`` costs nothing until a rule is used.
"""
import importlib

from ...exceptions import RuleEvaluationConditionMet

_BUILTIN = ("AllZero", "ClassImbalance", "DeadRelu", "ExplodingTensor", "FeatureImportanceOverweight",
            "LossNotDecreasing", "LossSpike", "Overfit", "Overtraining", "PoorWeightInitialization", "SaturatedActivation",
            "SimilarAcrossRuns", "StalledTrainingRule", "TensorVariance", "TreeDepth", "UnchangedTensor",
            "VanishingGradient", "WeightUpdateRatio")
_LAZY = {
    **{name: "builtin" for name in _BUILTIN},
    "BUILTIN_RULES": "builtin",
    "Action": "actions", "Callback": "actions", "LogMessage": "actions", "RuleEvent": "actions",
    "StopTraining": "actions", "DumpFlightRecorder": "actions",
    "RuleReport": "report",
    "Rule": "rule", "invoke_rule": "rule", "run_rules": "rule",
    # The stop-request file is run-directory protocol (storage); rules write it.
    "StopRequestPoller": "...storage.stop_request", "read_stop_request": "...storage.stop_request",
    "write_stop_request": "...storage.stop_request",
    "Required": "views", "StepView": "views",
    "attach_rule": "live", "LiveRule": "live",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module if module.startswith(".") else f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["RuleEvaluationConditionMet", *sorted(_LAZY)]

"""The Hugging Face Trainer's ``EarlyStoppingCallback``, recorded as part of the run.

The callback notes the global step of each evaluation (its last EVAL step, where the
``eval_*`` metrics are saved) and, when training ends, records what early stopping monitored
(``metric_for_best_model`` as the Trainer reports it, ``eval_<metric>``, saved as the
tensor ``scalar/eval_<metric>``), its patience, the best evaluation's step and whether it
stopped training. The callback is found beside this one in the Trainer's callback list.
"""
from __future__ import annotations

from transformers import EarlyStoppingCallback

from smdebug.capture.early_stopping import EvaluationPasses, callbacks_beside


def monitored_tensor(metric: str) -> str:
    """The saved tensor of ``metric_for_best_model`` (the Trainer prefixes ``eval_`` as early stopping does)."""
    return "scalar/" + (metric if metric.startswith("eval_") else f"eval_{metric}")


class TrainerEarlyStopping:
    """Follows the early stopping of one training (none among the callbacks: does nothing)."""

    def __init__(self, owner):
        self._owner = owner  # the DebuggerCallback, in the Trainer's callback list
        self._stopping = None
        self._passes = EvaluationPasses()

    def begin(self) -> None:
        found = callbacks_beside(self._owner, EarlyStoppingCallback)
        self._stopping = found[0] if found else None
        self._passes = EvaluationPasses()

    def evaluation_end(self, hook) -> None:
        if self._stopping is not None:
            self._passes.add(hook.global_step)

    def end(self, args, state, hook) -> None:
        stopping, self._stopping = self._stopping, None
        if stopping is None or not args.metric_for_best_model:
            return
        wait, patience = int(stopping.early_stopping_patience_counter), int(stopping.early_stopping_patience)
        self._passes.record_into(
            hook, framework="transformers", mechanism="transformers.EarlyStoppingCallback",
            monitor=monitored_tensor(args.metric_for_best_model), mode="max" if args.greater_is_better else "min",
            patience=patience, passes_since_best=wait, stopped=wait >= patience, best_value=state.best_metric,
            last_step=hook.global_step)

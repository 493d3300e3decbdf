"""``rule.req_tensors``: the tensors a rule written for smdebug 1.0.34 declares in
``set_required_tensors(step)``, under that library's names.

New rules return :class:`smdebug.rules.Required` entries from ``required_tensors(step)``
instead; a rule that fills ``req_tensors`` is read the same way (its names become one
``Required(names=..., value=True)`` for the step, fetched in one batch).
"""
from typing import Dict, Iterable, List

from ...exceptions import TensorUnavailable

__all__ = ["RequiredTensors", "RequiredTensorsForTrial"]


class RequiredTensorsForTrial:
    """The tensors (and their steps) a rule reads from one trial."""

    def __init__(self, trial):
        self.trial = trial
        self._tensor_steps: Dict[str, List[int]] = {}
        self._tensors: Dict[str, object] = {}

    def add(self, name: str, steps: Iterable[int], should_match_regex: bool = False) -> None:
        """Require tensor ``name`` (or every tensor matching it, with ``should_match_regex``)
        at ``steps``; raises TensorUnavailable for a name the trial does not have."""
        steps = [int(s) for s in steps]
        names = self.trial.tensor_names(regex=[name]) if should_match_regex else [name]
        if not should_match_regex and not self.trial.has_tensor(name):
            raise TensorUnavailable(name)
        for one in names:
            self._tensor_steps.setdefault(one, []).extend(s for s in steps if s not in self._tensor_steps.get(one, ()))
            if one not in self._tensors:
                self._tensors[one] = self.trial.tensor(one)

    def get_tensor_steps(self, name: str) -> List[int]:
        return self._tensor_steps[name]

    def get_names(self):
        return self._tensor_steps.keys()

    def get(self):
        """The required tensors (``smdebug.trials.Tensor`` objects)."""
        return self._tensors.values()

    def clear(self) -> None:
        self._tensor_steps.clear()
        self._tensors.clear()

    def fetch(self) -> None:
        """Wait for the required steps, then read every required value once."""
        steps = sorted({s for steps in self._tensor_steps.values() for s in steps})
        if steps:
            self.trial.wait_for_steps(steps)
        for name, steps in self._tensor_steps.items():
            for step in steps:
                self._tensors[name].value(step)


class RequiredTensors:
    """``req_tensors`` of a rule: one :class:`RequiredTensorsForTrial` per trial it reads."""

    def __init__(self, base_trial, other_trials=None):
        self.base_trial = base_trial
        self._per_trial = {}
        for trial in [base_trial, *(other_trials or [])]:
            if trial is not None:
                self._per_trial[id(trial)] = RequiredTensorsForTrial(trial)

    def _for(self, trial) -> RequiredTensorsForTrial:
        trial = self.base_trial if trial is None else trial
        try:
            return self._per_trial[id(trial)]
        except KeyError:
            raise ValueError(f"trial {getattr(trial, 'name', trial)!r} is neither the rule's base_trial nor one of "
                             "its other_trials; pass it to the rule's constructor") from None

    def add(self, name: str, steps: Iterable[int], trial=None, should_match_regex: bool = False) -> None:
        self._for(trial).add(name, steps, should_match_regex=should_match_regex)

    def get_tensor_steps(self, name: str, trial=None) -> List[int]:
        return self._for(trial).get_tensor_steps(name)

    def get_names(self, trial=None):
        return self._for(trial).get_names()

    def get(self, trial=None):
        return self._for(trial).get()

    def clear(self) -> None:
        for one in self._per_trial.values():
            one.clear()

    def fetch(self) -> None:
        for one in self._per_trial.values():
            one.fetch()

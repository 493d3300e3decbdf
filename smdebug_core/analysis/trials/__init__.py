"""Reading saved runs: ``create_trial(path)`` returns a :class:`Trial`."""
from .tensor import Tensor
from .trial import LocalTrial, StepState, Trial, create_trial

__all__ = ["create_trial", "Trial", "Tensor", "StepState", "LocalTrial"]

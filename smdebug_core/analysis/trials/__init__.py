"""Reading saved runs: ``create_trial(path)`` returns a :class:`Trial`."""
from .steps import StepState
from .tensor import Tensor
from .trial import LocalTrial, Trial, create_trial

__all__ = ["create_trial", "Trial", "Tensor", "StepState", "LocalTrial"]

"""Reading saved runs: ``create_trial(path)`` returns a :class:`Trial`; ``trial.catalog()``
says what each tensor saved (:class:`Catalog` of :class:`TensorEntry`)."""
from .catalog import Catalog, SavedSteps, TensorEntry
from .order import ModelOrder
from .steps import StepState
from .tensor import Tensor
from .trial import LocalTrial, Trial, create_trial

__all__ = ["create_trial", "Trial", "Tensor", "StepState", "LocalTrial", "Catalog", "TensorEntry", "SavedSteps",
           "ModelOrder"]

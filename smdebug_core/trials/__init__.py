"""smdebug 1.0.34's import path for reading runs: ``from smdebug.trials import create_trial``.

The reader lives in :mod:`smdebug.analysis.trials`; these are its names, not copies.
"""
from ..analysis.trials import LocalTrial, StepState, Tensor, Trial, create_trial

__all__ = ["create_trial", "Trial", "Tensor", "StepState", "LocalTrial"]

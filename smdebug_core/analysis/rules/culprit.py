"""Naming the culprit of a rule's finding: the layer a tensor belongs to and the step its
condition started at. Which of several tensors came first is the run's model order, defined
once in smdebug.analysis.trials.order (rules ask their view: ``self.view.model_order()``);
the names below are kept for code written against them and order by name alone.
"""
from __future__ import annotations

from typing import Iterable, List, Optional

from ..trials.order import BY_NAME, inferred_key as forward_rank, layer_of

__all__ = ["culprit", "layer_of", "forward_rank", "first_in_forward_order", "in_forward_order"]


def first_in_forward_order(names: Iterable[str]) -> Optional[str]:
    return BY_NAME.first(names)


def in_forward_order(names: Iterable[str]) -> List[str]:
    return BY_NAME.sorted(names)


def culprit(tensor: str, first_step: int, **more) -> dict:
    """The ``culprit`` entry of a finding's details: the layer, the tensor, and the step its
    condition started at."""
    return {"layer": layer_of(tensor), "tensor": tensor, "first_step": int(first_step), **more}

"""The contract between the core Hook and a framework's tensors.

An adapter gives the hook a :class:`TensorBackend` for its tensor type. On a saved
step the hook calls :meth:`TensorBackend.snapshot` when a tensor is recorded (so a
later in-place update, such as an optimizer step, cannot change what is saved) and,
once at the end of the step, :meth:`TensorBackend.materialize` with every tensor the
step recorded. A device backend computes all reductions there with a few batched ops
and moves everything to the host in one transfer; the numpy backend is the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import reductions

ReductionKey = Tuple[str, bool]  # (reduction name, on absolute values)


@dataclass
class Request:
    """What the hook needs of one recorded tensor at this step."""

    name: str
    value: Any  # the backend's snapshot
    raw: bool
    shape: bool
    reductions: Tuple[ReductionKey, ...]


@dataclass
class Materialized:
    """The host-side result for one Request."""

    raw: Optional[np.ndarray]
    shape: Optional[Tuple[int, ...]]
    #: Some or all of the request's reductions, in the request's order (the hook names the
    #: values by position when all are there).
    reductions: Dict[ReductionKey, np.ndarray] = field(default_factory=dict)


class TensorBackend:
    """Base class; adapters subclass it for their tensor type."""

    name = "abstract"

    def accepts(self, value) -> bool:
        """Whether this backend handles ``value``'s type."""
        raise NotImplementedError

    def snapshot(self, value, needs_copy: bool):
        """A stable reference to ``value`` for the end of the step (copy if it may mutate)."""
        raise NotImplementedError

    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        """Compute reductions and copy raw values to numpy for every request, batched."""
        raise NotImplementedError


class NumpyBackend(TensorBackend):
    """Reference backend for numpy arrays, Python numbers and anything array-like."""

    name = "numpy"

    def accepts(self, value) -> bool:
        return True

    def snapshot(self, value, needs_copy: bool):
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"cannot save an object array (dtype=object); got {type(value).__name__}")
        return array.copy() if needs_copy and array is value else array

    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        out = []
        for req in requests:
            array = req.value
            result = Materialized(raw=array if req.raw else None, shape=tuple(array.shape) if req.shape else None)
            if req.reductions and array.size and array.dtype.kind in "biufc":
                values = reductions.reduce_many(array, req.reductions)
                result.reductions = dict(zip(req.reductions, values))
            out.append(result)
        return out

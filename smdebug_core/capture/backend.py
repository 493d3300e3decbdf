"""The contract between the step session and a framework's tensors.

An adapter gives the hook a :class:`TensorBackend` for its tensor type. Two ways in:

* one tensor at a time (``hook.record``): the hook calls :meth:`TensorBackend.snapshot`
  when the tensor is recorded (a copy, if it may change before the step ends) and, at the
  end of the step, :meth:`TensorBackend.materialize` with every such tensor;
* a batch (``hook.start_batch``, the hot path): :meth:`TensorBackend.start_batch` runs on
  the training thread when the adapter hands the tensors over and does only what cannot
  wait (a device backend launches its kernels there, in stream order); then
  :meth:`TensorBackend.finish_batch` runs on the step pipeline's worker thread and returns
  a :class:`BatchResult`: all reductions of the batch in a few whole-batch ops, raw values
  copied to the host. Until the adapter's fence (``TensorBatch.wait``) the tensors must not
  change; a backend that can tell (torch version counters) reports those that did as lost.

Every backend only produces the partial columns of :mod:`smdebug.reduction_columns` (the numpy
backend: segments of one flat float64 copy), finished by its one finisher; tests/contract checks
each against the reference definitions, :mod:`smdebug.reductions`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import reduction_columns, reductions

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


@dataclass
class BatchResult:
    """Host-side results of a batch: tensors handed over together with the same reductions."""

    #: ``[n, len(keys)]`` float64, row i for tensor i (a row of NaN for an empty tensor, which
    #: has no reductions: see ``unreduced``); None when no reductions were asked for.
    reductions: Optional[np.ndarray]
    #: The host copy of each tensor (when raw values were asked for), else None.
    raw: Optional[List[Optional[np.ndarray]]]
    shapes: List[Tuple[int, ...]]
    #: Positions of empty tensors (nothing to reduce).
    unreduced: Tuple[int, ...] = ()
    #: Positions not saved, with why (changed in place before they were read; a value the
    #: backend cannot handle): one bad tensor costs that tensor, not the step.
    lost: Dict[int, str] = field(default_factory=dict)


class TensorBackend(ABC):
    """The tensor half of the adapter contract; adapters subclass it for their tensor type.

    ``accepts``, ``snapshot`` and ``materialize`` are required (a backend that lacks one
    cannot be instantiated: the error names it); the batch methods have defaults built on
    them. ``tests/contract`` checks every installed backend against the numpy reference."""

    name = "abstract"

    @abstractmethod
    def accepts(self, value) -> bool:
        """Whether this backend handles ``value``'s type."""

    @abstractmethod
    def snapshot(self, value, needs_copy: bool):
        """A stable reference to ``value`` for the end of the step (copy if it may mutate)."""

    @abstractmethod
    def materialize(self, requests: Sequence[Request]) -> List[Materialized]:
        """Compute reductions and copy raw values to numpy for every request, batched."""

    # --- batches: start on the training thread, finish on the pipeline's worker ---------------
    def start_batch(self, tensors: Sequence, keys: Tuple[ReductionKey, ...], raw: bool):
        """Training thread: what must happen now for ``tensors`` (default: private copies,
        since the batch is finished later on another thread)."""
        return [self.snapshot(t, True) for t in tensors], keys, raw

    def finish_here(self, started) -> bool:
        """Whether a started batch is cheaper to finish on the training thread right away
        than on the worker: a hand-off costs GIL hand-overs (thread wake-ups) that only
        large batches repay. Default: yes (copies are already made; the rest is small)."""
        return True

    def finish_batch(self, started) -> BatchResult:
        """Worker thread: the :class:`BatchResult` of a batch begun by :meth:`start_batch`."""
        snaps, keys, raw = started
        return pack_results(self.materialize([Request("", s, raw, True, keys) for s in snaps]), keys, raw)


class NumpyBackend(TensorBackend):
    """Backend for numpy arrays, Python numbers and anything array-like."""

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
        by_keys: Dict[Tuple[ReductionKey, ...], List[int]] = {}
        for i, req in enumerate(requests):
            array = req.value
            out.append(Materialized(raw=array if req.raw else None, shape=tuple(array.shape) if req.shape else None))
            if req.reductions and array.size and array.dtype.kind in "biufc":
                by_keys.setdefault(tuple(req.reductions), []).append(i)
        for keys, members in by_keys.items():  # segments of one flat float64 copy per set of keys
            flats = [reductions.as_float_array(requests[i].value).reshape(-1) for i in members]
            plan = reduction_columns.segments(np.array([f.size for f in flats], np.int64))
            table = reduction_columns.finish_table(
                reduction_columns.flat_columns(np.concatenate(flats), plan, reduction_columns.columns_for(keys)), keys)
            for i, row in zip(members, table):
                out[i].reductions = {key: np.asarray(value) for key, value in zip(keys, row)}
        return out


def pack_results(results: Sequence[Materialized], keys: Tuple[ReductionKey, ...], raw: bool) -> BatchResult:
    """Per-tensor :class:`Materialized` results as one :class:`BatchResult`."""
    table = None
    unreduced = []
    if keys:
        table = np.full((len(results), len(keys)), np.nan)
        for i, result in enumerate(results):
            if len(result.reductions) == len(keys):
                table[i] = [result.reductions[k] for k in keys]
            else:
                unreduced.append(i)
    return BatchResult(reductions=table, raw=[r.raw for r in results] if raw else None,
                       shapes=[tuple(r.shape) if r.shape is not None else () for r in results],
                       unreduced=tuple(unreduced))

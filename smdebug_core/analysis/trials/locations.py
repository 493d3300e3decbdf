"""Where a tensor's records are: what the index files say about one tensor, step by step.

A :class:`TensorLocation` is one record of an event file (or of a run store's chunk file),
an :class:`InlineValue` a number the run store keeps in its statistics table; :class:`TensorRecords` keeps a
tensor's locations (its values, saved reductions), saved shapes and shard placements by
global step and worker, filled while index files are registered and read by ``Tensor``.
"""
from typing import Callable, Dict, List, NamedTuple, Optional, Set, Tuple

import numpy as np

from ...storage.format.index import Placement


class TensorLocation(NamedTuple):
    """A record of an event file, as an index file describes it."""

    event_file: str  # relative to the run directory
    start: int
    length: int
    crc32c: Optional[int]  # of the payload; None when the index does not say
    record_name: str  # the name in the index (the reduction tag for reductions)


_DTYPES: Dict[str, object] = {}


def dtype_named(name: str):
    """The numpy dtype called ``name`` (ml_dtypes' bfloat16 and float8 types too)."""
    found = _DTYPES.get(name)
    if found is None:
        try:
            found = np.dtype(name)
        except TypeError:
            import ml_dtypes

            found = np.dtype(getattr(ml_dtypes, name))
        _DTYPES[name] = found
    return found


class InlineValue(NamedTuple):
    """A value the run store keeps in its statistics table (docs/format.md 10): one number
    and the dtype and rank (0: shape ``()``, 1: shape ``(1,)``) it was saved with; there is
    no record to read. Stands where a :class:`TensorLocation` would."""

    value: float
    dtype: str
    ndim: int
    record_name: str

    def array(self) -> np.ndarray:
        """The saved value as the read-only array it was saved as."""
        out = np.array(self.value, dtype=dtype_named(self.dtype))
        if self.ndim:
            out = out.reshape((1,) * self.ndim)
        out.setflags(write=False)
        return out


class ReadRequest(NamedTuple):
    """One record to read: ``key`` names its value in the result."""

    key: object
    location: TensorLocation
    step: int
    worker: str


class TensorRecords:
    """One tensor's records by global step and worker: a raw value, saved reductions and a
    saved shape, independently (a shape entry never hides the raw value of the same step,
    docs/format.md 3.2), and where a sharded tensor's pieces lie. Only ever added to."""

    def __init__(self):
        self.locations: Dict[int, Dict[str, TensorLocation]] = {}
        self.reductions: Dict[int, Dict[str, Dict[Tuple[str, bool], TensorLocation]]] = {}
        self.shapes: Dict[int, Dict[str, Tuple[int, ...]]] = {}
        # step -> worker -> where that worker's saved value lies in the full tensor (sharded)
        self.placements: Dict[int, Dict[str, Placement]] = {}
        self.step_workers: Dict[int, Set[str]] = {}
        self._sorted_steps: Optional[List[int]] = []

    def _note(self, step: int, worker: str) -> None:
        workers = self.step_workers.get(step)
        if workers is None:
            workers = self.step_workers[step] = set()
            self._sorted_steps = None
        workers.add(worker)

    def add_value(self, step: int, worker: str, location: TensorLocation) -> None:
        # Called once per index entry while loading: kept flat on purpose.
        by_worker = self.locations.get(step)
        if by_worker is None:
            self.locations[step] = {worker: location}
        else:
            by_worker[worker] = location
        workers = self.step_workers.get(step)
        if workers is None:
            self.step_workers[step] = {worker}
            self._sorted_steps = None
        else:
            workers.add(worker)

    def add_reduction(self, step: int, worker: str, key: Tuple[str, bool], location: TensorLocation) -> None:
        # Called once per index entry while loading (most entries are reductions): kept flat.
        by_worker = self.reductions.get(step)
        if by_worker is None:
            self.reductions[step] = {worker: {key: location}}
        else:
            by_key = by_worker.get(worker)
            if by_key is None:
                by_worker[worker] = {key: location}
            else:
                by_key[key] = location
        workers = self.step_workers.get(step)
        if workers is None:
            self.step_workers[step] = {worker}
            self._sorted_steps = None
        else:
            workers.add(worker)

    def add_placement(self, step: int, worker: str, placement: Placement) -> None:
        self.placements.setdefault(step, {})[worker] = placement

    def add_shape(self, step: int, worker: str, shape: Tuple[int, ...]) -> None:
        self.shapes.setdefault(step, {})[worker] = tuple(shape)
        self._note(step, worker)

    def global_steps(self) -> List[int]:
        """Sorted global steps at which anything of the tensor was saved."""
        if self._sorted_steps is None:
            self._sorted_steps = sorted(self.step_workers)
        return self._sorted_steps

    def has_complete_step(self, is_complete: Callable[[int], bool]) -> bool:
        return any(is_complete(g) for g in self.global_steps())

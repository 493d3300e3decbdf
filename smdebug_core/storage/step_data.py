"""What capture hands to the writer: one :class:`StepData` per (global step, worker).

The carriers sit here, below both the writer (``writer/``, which consumes them) and
capture (which builds them and sizes them for the flight recorder), so neither imports
the other's internals. Plain data and arithmetic on it: no I/O, no encoding.
"""
import operator
import time
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from ..modes import ModeKeys

#: Rough cost of a queued item that is not array data (names, small python objects).
ITEM_OVERHEAD_BYTES = 256


@dataclass
class StepData:
    """Everything one (global step, worker) contributes, handed from the hook to the writer.

    ``tensors`` are ``(final tag, array or numpy scalar)`` in write order (tags already include
    ``smdebug/reductions/...`` prefixes), or :class:`ScalarRun` items standing for many such
    pairs of float64 scalars (a batch's reductions; :func:`iter_records` flattens them).
    ``shapes`` are ``(name, shape)`` or ``(name, original_name, shape)`` for tensors saved as shape only (a shape whose name
    is also written as a tensor in the same step is left out of the index, docs/format.md 3.2). ``tb_scalars`` / ``tb_histograms`` go to TensorBoard with raw
    names (tags are cleaned by the writer).

    The arrays are read later, on the writer thread: they must be host copies that the
    caller does not modify after :meth:`~smdebug.storage.writer.RunWriter.submit` (e.g. not
    ``param.numpy()`` of a tensor that the optimizer updates in place).
    """

    global_step: int
    mode: ModeKeys
    mode_step: int
    worker: str
    tensors: List[Tuple[str, np.ndarray]] = field(default_factory=list)
    shapes: List[Tuple[str, tuple]] = field(default_factory=list)
    tb_scalars: List[Tuple[str, float]] = field(default_factory=list)
    tb_histograms: List[Tuple[str, np.ndarray]] = field(default_factory=list)
    wall_time: float = field(default_factory=time.time)
    #: The step replaces one already published (the flight recorder writes a kept step whose
    #: scalars were published alone, docs/flight_recorder.md): its files are written anew.
    replace: bool = False
    #: name -> placement of a record that is one piece of a larger tensor (docs/format.md 3.3)
    placements: Dict[str, dict] = field(default_factory=dict)

    def nbytes(self):
        """Approximate memory held by this item (array bytes plus a small per-item cost)."""
        items = 1 + len(self.tensors) + len(self.tb_histograms) + len(self.shapes) + len(self.tb_scalars)
        return records_nbytes(self.tensors) + records_nbytes(self.tb_histograms) + ITEM_OVERHEAD_BYTES * items


class ScalarRun:
    """Many float64 scalar records in one array: record ``i`` is ``(tags[i], values[i])``.

    What a batch of reductions becomes (hundreds of records a step). An item of
    :attr:`StepData.tensors`, written from one cached template per list of tags
    (:class:`~smdebug.storage.format.record_templates.ScalarRunLayout`: a few numpy calls
    for the whole run), byte for byte as the same pairs would be. ``values`` is copied: the
    caller may reuse its array.
    """

    __slots__ = ("tags", "values")

    def __init__(self, tags, values):
        values = np.array(values, dtype="<f8").reshape(-1)
        if len(tags) != len(values):
            raise ValueError(f"a ScalarRun needs one value per tag: {len(tags)} tags, {len(values)} values")
        self.tags = tags
        self.values = values

    def __len__(self):
        return len(self.tags)

    @property
    def nbytes(self):
        return self.values.nbytes

    def pairs(self):
        """The run as ``(tag, numpy float64)`` pairs."""
        return list(zip(self.tags, self.values))


def iter_records(tensors):
    """The ``(tag, value)`` pairs of a :attr:`StepData.tensors` list, runs flattened."""
    for item in tensors:
        if type(item) is ScalarRun:
            yield from zip(item.tags, item.values)
        else:
            yield item


_VALUE = operator.itemgetter(1)
_NBYTES = operator.attrgetter("nbytes")


def records_nbytes(tensors) -> int:
    """Bytes of the values of a list of ``(name, value)`` pairs and :class:`ScalarRun`s.
    Runs on the training thread at each saved step: one pass in C when every item is a
    pair of numpy values (the usual case without runs); a Python number counts 8 bytes."""
    try:
        return sum(map(_NBYTES, map(_VALUE, tensors)))
    except (AttributeError, TypeError):  # a run, or a Python number among the values
        return sum([item.nbytes if type(item) is ScalarRun else getattr(item[1], "nbytes", 8)
                    for item in tensors])

"""Model order, defined once: the order a run's tensors were produced in, for the rules (which
tensor went bad first), the report and plots (layers listed as the model reads) and ``compare``
(which difference came first).

Where the run says it, it is the *production order*: a step's records are written in the order
the hook captured them (for PyTorch: parameters in the order the model registers them when the
step begins, module outputs in forward order, the loss, then gradients as the backward pass
makes them). Both layouts keep it: 1.0.34 runs as the records' offsets in a step's event file,
the run store as the rows' order within a step of a segment. The store keeps a step's whole
tensors and its numbers (scalars, reductions) in two tables and not how the two interleave:
its whole tensors count as written before its numbers (StoreLog). It is read from the (step,
worker) holding the most records of the tensors asked about.

Where the run does not say it (a tensor not saved at that step, a live rule that sees one step),
it is inferred from the names (docs/format.md): PyTorch parameters are ``<RootClass>_<module
path>.<param>`` and their gradients ``gradient/<same>``, module tensors ``<module
path>_input_<i>``/``_output_<i>``, losses ``<LossClass>_output_0``; TensorFlow's
``<layer>/<variable>``. A parameter comes before the activations it feeds, then activations,
the loss, then gradients from the last layer to the first; within a kind, layers by name with
numbers compared as numbers (``fc2`` before ``fc10``): the definition order of most models.
Produced tensors come before inferred ones. A gradient is the exception: its record's place is
not when the backward pass made it, so it takes its parameter's place reversed.

:class:`ModelOrder` answers both questions asked of it: :meth:`ModelOrder.key` (time order
within a step: the culprit of a finding, the first divergence) and :meth:`ModelOrder.layer_key`
(layers as the model reads them, a derived tensor such as ``gradient/W`` at its parameter's
place: rows of a heatmap).
"""
from __future__ import annotations

import re
from types import MappingProxyType
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

_GRADIENT = "gradient/"
_UPDATE = "update/"
_MODULE_TENSOR = re.compile(r"_(input|output)_\d+$")
_PARAMETER = re.compile(r"\.(weight|bias|kernel|gamma|beta|running_mean|running_var|[A-Za-z_]+)$")
_ROOT_PREFIX = re.compile(r"^[A-Z][A-Za-z0-9]*_(?=[A-Za-z_])")  # <RootClass>_ of PyTorch parameter names
_LOSS = re.compile(r"loss", re.IGNORECASE)
#: Name prefixes of tensors derived from a parameter (``gradient/W``, ``update/W``...).
DERIVED_PREFIXES = ("gradient/", "gradients/", "update/", "update_ratio/")


def layer_of(name: str) -> str:
    """The layer (module path) a tensor belongs to: ``Net_fc2.weight`` -> ``fc2``,
    ``gradient/Net_fc2.bias`` -> ``fc2``, ``relu1_output_0`` -> ``relu1``, ``dense/kernel:0``
    -> ``dense``; the name itself when it says nothing more."""
    base = name
    for prefix in (_GRADIENT, _UPDATE):
        if base.startswith(prefix):
            base = base[len(prefix):]
    if _MODULE_TENSOR.search(base):
        return _MODULE_TENSOR.sub("", base) or name
    if "/" in base:  # TensorFlow: layer/variable
        return base.split("/")[0] or name
    stripped = _ROOT_PREFIX.sub("", base) if "." in base else base
    if "." in stripped:
        stripped = _PARAMETER.sub("", stripped)
    return stripped or name


def parameter_of(name: str) -> str:
    """The tensor a derived tensor belongs to: ``gradient/W``, ``update/W`` and
    ``optimizer/W/<state>`` are W's; any other name is its own."""
    for prefix in DERIVED_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    if name.startswith("optimizer/") and name.count("/") >= 2:
        return name[len("optimizer/"):].rsplit("/", 1)[0]
    return name


def natural_key(text: str) -> Tuple:
    """Numbers compared as numbers: ``fc2`` before ``fc10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


class _Reversed(str):
    """A string that sorts in reverse (for the backward pass's order)."""

    def __lt__(self, other):
        return str.__gt__(self, other)

    def __gt__(self, other):
        return str.__lt__(self, other)


def inferred_key(name: str) -> Tuple:
    """The order inferred from a name alone (see the module docstring)."""
    if name.startswith(_GRADIENT):
        # The backward pass runs from the last layer to the first.
        return (3, tuple((-p if isinstance(p, int) else _Reversed(p)) for p in natural_key(layer_of(name))))
    if _MODULE_TENSOR.search(name):
        return (2, natural_key(layer_of(name))) if _LOSS.search(name) else (1, natural_key(layer_of(name)))
    return (0, natural_key(layer_of(name)))


def production_ranks(columns: Mapping[str, np.ndarray], ids: Mapping[int, str]
                     ) -> Tuple[Dict[str, int], Dict[Tuple[int, int], int]]:
    """From a record log's columns (``step``, ``worker``, ``tensor``, ``label``, ``start``: see
    RecordLog.arrays, StoreLog.arrays): the rank of each tensor of ``ids`` (tensor id -> name)
    and of each (tensor id, label id) in the (step, worker) holding the most of their records,
    in the order they were written there. Tensors not saved there are left out."""
    if not ids or not len(columns.get("step", ())):
        return {}, {}
    tensor = columns["tensor"]
    if len(ids) >= int(tensor.max()) + 1:  # every tensor: no mask
        where = np.arange(len(tensor))
    else:
        where = np.flatnonzero(np.isin(tensor, np.fromiter(ids, np.int64, len(ids))))
        if not len(where):
            return {}, {}
    workers = columns["worker"][where].astype(np.int64)
    key = columns["step"][where] * (int(workers.max()) + 1) + workers
    # Rows come in blocks of one (step, worker): counted block by block, not row by row.
    starts = np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1]
    blocks, inverse = np.unique(key[starts], return_inverse=True)
    counts = np.bincount(inverse, weights=np.diff(np.r_[starts, len(key)]), minlength=len(blocks))
    chosen = where[key == blocks[int(np.argmax(counts))]]
    chosen = chosen[np.argsort(columns["start"][chosen], kind="stable")]
    ranks: Dict[str, int] = {}
    pairs: Dict[Tuple[int, int], int] = {}
    for tensor_id, label_id in zip(columns["tensor"][chosen].tolist(), columns["label"][chosen].tolist()):
        ranks.setdefault(ids[tensor_id], len(ranks))
        pairs.setdefault((tensor_id, label_id), len(pairs))
    return ranks, pairs


class ModelOrder:
    """The order of a run's tensors (see the module docstring): ``produced`` maps the names
    whose production order the run records to their rank; every other name is ordered after
    them, by its name."""

    def __init__(self, produced: Optional[Mapping[str, int]] = None):
        self.produced: Mapping[str, int] = MappingProxyType(dict(produced or {}))

    def __repr__(self):
        return f"<ModelOrder: {len(self.produced)} tensors in production order>"

    def key(self, name: str) -> Tuple:
        """A sort key: the order the tensors came in within a step (production, else inferred).
        A gradient's record is not written when the backward pass makes it (PyTorch writes them
        in registration order once it ends): it takes its parameter's place reversed, after
        every produced tensor; by its name when its parameter's place is not known."""
        if name.startswith(_GRADIENT):
            rank = self.produced.get(name[len(_GRADIENT):])
            return (1, -rank, ()) if rank is not None else (2, 0, inferred_key(name))
        rank = self.produced.get(name)
        return (0, rank, ()) if rank is not None else (2, 0, inferred_key(name))

    def sorted(self, names: Iterable[str]) -> List[str]:
        return sorted(names, key=self.key)

    def first(self, names: Iterable[str]) -> Optional[str]:
        """The name that came first (None for none)."""
        names = list(names)
        return min(names, key=self.key) if names else None

    def layer_key(self, name: str) -> Tuple:
        """A sort key listing layers as the model reads them: a derived tensor (``gradient/W``,
        ``update/W``, ``optimizer/W/m``) at its parameter's place, then by name."""
        base = parameter_of(name)
        rank = self.produced.get(base, self.produced.get(name))
        if rank is not None:
            return (0, rank, (), natural_key(name))
        return (1, 0, inferred_key(base), natural_key(name))

    def by_layer(self, names: Iterable[str]) -> List[str]:
        return sorted(names, key=self.layer_key)


#: The order names alone give (a run that records none, a live rule).
BY_NAME = ModelOrder()

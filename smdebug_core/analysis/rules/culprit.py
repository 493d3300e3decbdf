"""Naming the culprit of a rule's finding: the layer a tensor belongs to, and which of several
tensors came first in the forward pass.

Tensor names say where they come from (docs/format.md): PyTorch parameters are
``<RootClass>_<module path>.<param>`` and their gradients ``gradient/<same>``, module tensors
``<module path>_input_<i>``/``_output_<i>``, losses ``<LossClass>_output_0``; TensorFlow's
``<layer>/<variable>``. A run does not record the order modules ran in, so "forward order"
is inferred from what each tensor is: a parameter is read before the activations it feeds
(a non-finite weight was broken by the update before this step), then activations, then the
loss, then gradients, which the backward pass produces from the last layer to the first.
Within a kind, layers are ordered by name with numbers compared as numbers (``fc2`` before
``fc10``): the definition order of most models.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Tuple

_GRADIENT = "gradient/"
_MODULE_TENSOR = re.compile(r"_(input|output)_\d+$")
_PARAMETER = re.compile(r"\.(weight|bias|kernel|gamma|beta|running_mean|running_var|[A-Za-z_]+)$")
_ROOT_PREFIX = re.compile(r"^[A-Z][A-Za-z0-9]*_(?=[A-Za-z_])")  # <RootClass>_ of PyTorch parameter names
_LOSS = re.compile(r"loss", re.IGNORECASE)
_UPDATE = "update/"


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


def _natural(text: str) -> Tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def forward_rank(name: str) -> Tuple:
    """A sort key putting tensors in (inferred) forward order; see the module docstring."""
    if name.startswith(_GRADIENT):
        # The backward pass runs from the last layer to the first.
        return (3, tuple((-p if isinstance(p, int) else _Reversed(p)) for p in _natural(layer_of(name))))
    if _MODULE_TENSOR.search(name):
        return (2, _natural(layer_of(name))) if _LOSS.search(name) else (1, _natural(layer_of(name)))
    return (0, _natural(layer_of(name)))


class _Reversed(str):
    """A string that sorts in reverse (for the backward pass's order)."""

    def __lt__(self, other):
        return str.__gt__(self, other)

    def __gt__(self, other):
        return str.__lt__(self, other)


def first_in_forward_order(names: Iterable[str]) -> Optional[str]:
    names = list(names)
    return min(names, key=forward_rank) if names else None


def in_forward_order(names: Iterable[str]) -> List[str]:
    return sorted(names, key=forward_rank)


def culprit(tensor: str, first_step: int, **more) -> dict:
    """The ``culprit`` entry of a finding's details: the layer, the tensor, and the step its
    condition started at."""
    return {"layer": layer_of(tensor), "tensor": tensor, "first_step": int(first_step), **more}

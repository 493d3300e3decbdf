"""Tensor names the TensorFlow hooks write (docs/format.md 8.4, adapted to Keras 3).

=====================================  ===============================================
What                                   Name
=====================================  ===============================================
Keras model variable                   ``<layer>/weights/<variable.path>``, e.g.
                                       ``dense/weights/dense/kernel``. ``<layer>`` is the
                                       innermost layer owning the variable; Keras 3
                                       variable paths carry no ``:0``.
Variable not in a registered model     ``weights/<name>`` (GradientTape path); a plain
                                       ``tf.Variable`` keeps TensorFlow's ``:0``.
Gradient of a variable                 ``gradients/<path or name without :0>Grad``, e.g.
                                       ``gradients/dense/kernelGrad``.
Optimizer variable (Keras 3)           its path under the optimizer's Keras 2 name,
                                       e.g. ``Adam/dense_kernel_momentum``,
                                       ``Adam/iteration`` (see optimizer_prefix).
Layer input/output                     ``<layer>/inputs``, ``<layer>/outputs``
                                       (``_<i>`` appended when there are several).
Model input / label / prediction       ``inputs``, ``labels``, ``predictions``
                                       (``_<i>`` appended when there are several).
Keras logs                             the log key: ``loss``, ``val_loss``, ``accuracy``...
Loss given to a wrapped tape           ``loss``
=====================================  ===============================================

Weights and biases are assigned by variable type (docs/format.md 8.4): a trainable variable whose
own name contains ``bias`` is a bias, every other model variable (non-trainable ones such
as batch-norm statistics included) is a weight.
"""
from __future__ import annotations

import re
from typing import List

_OUTPUT_INDEX = re.compile(r":\d+$")
_KERAS_NUMBERING = re.compile(r"_\d+$")  # Keras' uniquifying suffix: adam, adam_1, adam_2...


def variable_key(var) -> str:
    """The variable's identifier: the Keras 3 path, else the TensorFlow name (with ``:0``)."""
    path = getattr(var, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(var, "name", None)
    if isinstance(name, str) and name:
        return name
    raise TypeError(f"cannot name {type(var).__name__} {var!r}: it has neither a path nor a name")


def model_weight_name(layer_name: str, var) -> str:
    return f"{layer_name}/weights/{variable_key(var)}"


def loose_weight_name(var) -> str:
    return f"weights/{variable_key(var)}"


def gradient_name(var) -> str:
    return f"gradients/{_OUTPUT_INDEX.sub('', variable_key(var))}Grad"


def optimizer_prefix(optimizer) -> str:
    """The first component of an optimizer's variable names: the class name (``Adam``) when
    Keras named the optimizer itself (``adam``, ``adam_3``), the user's name otherwise.

    Keras 2, and so 1.0.34, named an optimizer after its class (``Adam/iter:0``); 1.0.34 scripts
    select its variables with ``include("Adam")``. Keras 3 numbers each new optimizer of a
    process (``adam_3``), which would also make the names of two runs in one process differ."""
    name = getattr(optimizer, "name", None) or ""
    class_name = type(optimizer).__name__
    if not name or _KERAS_NUMBERING.sub("", name).replace("_", "") == class_name.lower():
        return class_name
    return name


def optimizer_variable_name(var, optimizer_name: str = "", prefix: str = "") -> str:
    """``var``'s path, its first component (``optimizer_name``) replaced by ``prefix``."""
    key = variable_key(var)
    head, sep, rest = key.partition("/")
    if prefix and sep and head == optimizer_name:
        return f"{prefix}/{rest}"
    return key


def numbered(base: str, count: int) -> List[str]:
    """``[base]`` for one tensor, ``[base_0, base_1, ...]`` for several."""
    return [base] if count == 1 else [f"{base}_{i}" for i in range(count)]


def layer_tensor_base(layer_name: str, kind: str) -> str:
    return f"{layer_name}/{kind}"


def is_bias(var) -> bool:
    """A trainable variable whose own (last) name component mentions ``bias``."""
    if not getattr(var, "trainable", False):
        return False
    key = _OUTPUT_INDEX.sub("", variable_key(var))
    return "bias" in key.rsplit("/", 1)[-1].lower()


def is_rng_state(var) -> bool:
    """A Keras 3 ``SeedGenerator``'s state (Dropout's, the random layers'): ``model.variables``
    lists it, ``model.weights`` does not. Keras gives it this fixed name."""
    if getattr(var, "trainable", False):
        return False
    return _OUTPUT_INDEX.sub("", variable_key(var)).rsplit("/", 1)[-1] == "seed_generator_state"


def is_loss_log(key: str) -> bool:
    """Keras log keys that are losses (``loss``, ``val_loss``, ``<output>_loss``)."""
    return key == "loss" or key.endswith("_loss")

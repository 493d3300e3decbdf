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
Optimizer variable (Keras 3)           its path, e.g. ``adam/dense_kernel_momentum``,
                                       ``adam/iteration``.
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


def optimizer_variable_name(var) -> str:
    return variable_key(var)


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


def is_loss_log(key: str) -> bool:
    """Keras log keys that are losses (``loss``, ``val_loss``, ``<output>_loss``)."""
    return key == "loss" or key.endswith("_loss")

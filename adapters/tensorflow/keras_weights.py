"""The weights participant of :class:`.keras_hook.KerasHook`: naming and tracking model and
optimizer variables (models and optimizers built late are scanned again at step boundaries),
the optimizer's ``apply`` site (gradients, updates, and the trainable weights a compiled train
step copies before the update), and which weights that site delivers in place of a read when
a step begins."""
from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Dict, List, Optional

import keras

from smdebug.collections import CollectionKeys
from smdebug.modes import ModeKeys

from . import naming
from .base import NO_NAMES

K = CollectionKeys


def executing_eagerly() -> bool:
    import tensorflow as tf

    return tf.executing_eagerly()


def in_xla_context() -> bool:
    from .capture import in_xla_context as check

    return check()


def looks_like_variable(obj) -> bool:
    if isinstance(obj, keras.Variable):
        return True
    tf = sys.modules.get("tensorflow")  # a tf.Variable implies TensorFlow is imported
    return tf is not None and isinstance(obj, tf.Variable)


def layers_of(model) -> list:
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model] + list(getattr(model, "layers", []))


class KerasWeights:
    """Model and optimizer variables of a Keras hook, and its optimizer sites."""

    def __init__(self, hook):
        self.hook = hook
        self.names: Dict[int, str] = {}  # id(variable) -> saved name
        # Models registered before they had weights (built lazily, at their first batch):
        # scanned again at step boundaries until they have some.
        self.unbuilt: List[Any] = []  # Keras models
        self.unbuilt_optimizers: List[Any] = []
        # (model, its train_function, weight names): the optimizer site of that compiled train
        # function copied these trainable weights in a saved TRAIN step of fit; see delivered_by_sites.
        self.site_weights: Optional[tuple] = None
        # (site.fresh, len(hook._tracked), names) of the last check: the same variants ran
        # again, and no variable was tracked since, so the same names (see confirm_site_weights).
        self._fresh_names: Optional[tuple] = None
        self._optimizer_prefixes: Dict[int, str] = {}  # id(optimizer) -> first component of its variables' names

    # --- naming and tracking -------------------------------------------------------------
    def scan_variables(self, model) -> None:
        """Name every model and optimizer variable and track the ones that can be saved."""
        hook = self.hook
        owner: Dict[int, str] = {}
        for layer in layers_of(model):  # breadth-first: inner layers come later and win
            for var in getattr(layer, "weights", []):
                owner[id(var)] = layer.name
        for var in model.weights:
            name = naming.model_weight_name(owner.get(id(var), model.name), var)
            self.names[id(var)] = name
            hook._track(name, var, K.BIASES if naming.is_bias(var) else K.WEIGHTS)
        if not model.weights and not any(m is model for m in self.unbuilt):
            self.unbuilt.append(model)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            self.scan_optimizer(optimizer)
        for coll in list(hook.session.collection_manager):
            for obj in list(coll.framework_objects):
                if looks_like_variable(obj):
                    hook._track(self.variable_name(obj), obj, coll.name)

    def scan_optimizer(self, optimizer) -> None:
        prefix = self._optimizer_prefix(optimizer)
        keras_name = getattr(optimizer, "name", "") or ""
        for var in getattr(optimizer, "variables", []) or []:
            self.hook._track(naming.optimizer_variable_name(var, keras_name, prefix), var, K.OPTIMIZER_VARIABLES)
        if not getattr(optimizer, "built", True) and not any(o is optimizer for o in self.unbuilt_optimizers):
            # Its slots (momentum, velocity) appear when it is built, in the first train step.
            self.unbuilt_optimizers.append(optimizer)

    def _optimizer_prefix(self, optimizer) -> str:
        """naming.optimizer_prefix, unique in this hook: a second optimizer of the same class
        (a GAN's two Adams) keeps its Keras name."""
        prefix = self._optimizer_prefixes.get(id(optimizer))
        if prefix is None:
            prefix = naming.optimizer_prefix(optimizer)
            if prefix in self._optimizer_prefixes.values():
                prefix = getattr(optimizer, "name", "") or prefix
            self._optimizer_prefixes[id(optimizer)] = prefix
        return prefix

    def variable_name(self, var) -> str:
        name = self.names.get(id(var))
        if name is None:
            name = self.names[id(var)] = naming.loose_weight_name(var)
            self.hook._track(name, var, K.BIASES if naming.is_bias(var) else K.WEIGHTS)
        return name

    def scan_built_models(self) -> None:
        """Name and track the weights of models, and the slots of optimizers, that were built
        after set_model (a ``Sequential`` without an ``Input`` builds at its first batch, an
        optimizer at its first ``apply``)."""
        models = [model for model in self.unbuilt if model.weights]
        optimizers = [optimizer for optimizer in self.unbuilt_optimizers if getattr(optimizer, "built", True)]
        if not (models or optimizers):  # called at every step boundary until they are built
            return
        tracked = self.hook._tracked
        before = set(tracked)
        for model in models:
            self.unbuilt.remove(model)
            self.scan_variables(model)
        for optimizer in optimizers:
            self.unbuilt_optimizers.remove(optimizer)
            self.scan_optimizer(optimizer)
        for name in tracked:
            if name not in before:
                self.hook.session.plans.plan_for(name)  # seen by now: no "matched nothing" warning for them

    # --- the optimizer's apply -----------------------------------------------------------
    def wants_optimizer_site(self, model) -> bool:
        """Whether the optimizer's ``apply`` is wrapped: for gradients, and for trainable
        weights, which the wrapper copies in the compiled train step before the update.

        A model not built yet (a ``Sequential`` without an ``Input``, a subclassed model
        not called before ``fit``) has no weights to ask about, and fit traces its train
        step before they exist: the site is wrapped then (it keeps only what is included)."""
        if not model.weights:
            return True
        hook = self.hook
        return hook._updates.wanted_for(model.trainable_weights) or \
            any(hook._is_included(naming.gradient_name(v), K.GRADIENTS) or
                hook._is_included(self.names.get(id(v), "")) for v in model.trainable_weights)

    def patch_optimizer(self, optimizer) -> bool:
        patches = self.hook._patches
        if patches.has(optimizer, "apply"):
            return False
        original = optimizer.apply
        hook_ref = weakref.ref(self.hook)

        @functools.wraps(original)
        def apply(grads, trainable_variables=None):
            hook, pending = hook_ref(), None
            if hook is not None and hook.session.enabled:
                with hook.guard("capturing gradients"):
                    pending = hook._weights.offer_gradients(optimizer, grads, trainable_variables)
            result = original(grads, trainable_variables)
            if pending is not None and hook.session.enabled:
                hook._updates.after(pending)  # its own failure turns the updates off only
            return result

        patches.set(optimizer, "apply", apply)
        return True

    def offer_gradients(self, optimizer, grads, trainable_variables):
        """Offer the gradients and weights before ``apply``; returns what the updates need after it."""
        hook = self.hook
        self.scan_optimizer(optimizer)  # slots appear when the optimizer is built, possibly just now
        if self.unbuilt:  # built by this step's forward pass: its weights are named in time to be copied here
            self.scan_built_models()
        variables = list(trainable_variables) if trainable_variables is not None else \
            list(getattr(optimizer, "_trainable_variables", []) or [])
        grads = list(grads)
        if len(variables) != len(grads):
            return None
        named = [(naming.gradient_name(v), g) for v, g in zip(variables, grads) if g is not None]
        if hook._tf and not executing_eagerly():
            # Inside the train step the variables still hold the values of this step's
            # forward pass: copying them here spares fit the read when a step begins.
            for var in variables:
                name = self.names.get(id(var))
                if name is not None and hook._tracked.get(name) is var and hook._is_included(name):
                    named.append((name, var))
        hook._capture.offer(("optimizer", id(optimizer)), named)
        return hook._updates.before(optimizer, variables)

    # --- weights from the train step ------------------------------------------------------
    def delivered_by_sites(self) -> frozenset:
        """Trainable weights the optimizer site copies in this step, not read when it begins.

        Only in a TRAIN step of fit whose compiled train function is the one in which the
        site already copied them (confirmed at the end of an earlier saved step), one batch
        per step. Everything else (EVAL/PREDICT steps, a new or eager train function,
        ``steps_per_execution > 1``, custom loops) reads them when the step begins.
        """
        hook = self.hook
        confirmed = self.site_weights
        if confirmed is None or hook.session.mode != ModeKeys.TRAIN or not hook._in_fit or hook._graph_driven:
            return NO_NAMES
        model, function, names = confirmed
        current = hook.model
        if current is not model or getattr(current, "train_function", None) is not function or \
                getattr(current, "steps_per_execution", 1) != 1:
            return NO_NAMES
        return names

    def confirm_site_weights(self) -> None:
        """After a saved TRAIN step of fit: which trainable weights the optimizer site copied."""
        hook = self.hook
        model = hook.model
        optimizer = getattr(model, "optimizer", None)
        site = hook._capture.site(("optimizer", id(optimizer))) if optimizer is not None else None
        if site is None or not site.armed:
            return  # the site did not try to copy in this step: nothing learned
        tracked, fresh, cached = hook._tracked, site.fresh, self._fresh_names
        if cached is not None and cached[0] == fresh and cached[1] == len(tracked):  # names are only ever added
            names = cached[2]
        else:
            # A variant of a specialized function copies only what its layout holds.
            names = frozenset(name for variant in fresh for name, entry in zip(variant.names, variant.layout)
                              if name in tracked and (variant.owner is None or entry is not None))
            self._fresh_names = (fresh, len(tracked), names)
        if not names:
            self.site_weights = None  # armed but did not run: back to reading at step begin
            return
        function = getattr(model, "train_function", None)
        previous = self.site_weights
        if previous is not None and previous[0] is model and previous[1] is function and previous[2] == names:
            return  # unchanged: keep the same objects (their identity keys caches)
        self.site_weights = (model, function, names)

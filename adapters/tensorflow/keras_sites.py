"""The capture sites of :class:`.keras_hook.KerasHook` besides the optimizer's
(:mod:`.keras_weights`): a custom loop's ``tf.GradientTape`` (:class:`KerasTape`), the layers'
``call`` and the model's ``compute_loss``/``predict_step`` (:class:`KerasLayers`), and Keras'
batch logs (:class:`KerasLogs`). Each offers named tensors to the hook's capture
(:mod:`.capture`, :mod:`.eager_capture`)."""
from __future__ import annotations

import functools
import inspect
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import keras

from smdebug.collections import CollectionKeys

from . import naming
from .keras_weights import executing_eagerly, in_xla_context, layers_of, looks_like_variable

K = CollectionKeys
_MODEL_IO = (("inputs", K.INPUTS), ("labels", K.OUTPUTS), ("predictions", K.OUTPUTS))


def register_names(session, names: Sequence[str], collections: Sequence[Optional[str]]) -> None:
    """Add ``names`` to each of ``collections`` (None: none) that does not list them yet."""
    for coll_name in collections:
        if coll_name is None:
            continue
        coll = session.collection_manager.get(coll_name)
        known = coll.tensor_names
        for name in names:
            if name not in known:
                coll.add_tensor_name(name)


def is_tensor(value, tf: bool) -> bool:
    """Whether ``value`` is a tensor of the Keras backend (``tf``: TensorFlow's) with values."""
    if tf:
        from .backend import is_tf_value

        return is_tf_value(value)
    try:
        if not keras.ops.is_tensor(value):
            return False
    except Exception:  # noqa: BLE001 - a value Keras cannot classify is not a tensor here
        return False
    device = getattr(value, "device", None)
    return getattr(device, "type", None) != "meta"  # torch's shape-only tensors (symbolic build)


# ============================================================================ the tape
class KerasTape:
    """A custom loop's wrapped ``tf.GradientTape``: entering it begins a step, its
    ``gradient`` offers the gradients, the target (``loss``) and the sources' values."""

    def __init__(self, hook):
        self.hook = hook
        self.source_ids: set = set()

    def entered(self) -> None:
        hook = self.hook
        if executing_eagerly():
            hook.begin_step()
            return
        if hook._capture.begin_step_in_graph(self._begin_step_from_graph):
            # Python (the step's begin) runs unordered with the graph's variable updates, so
            # state is read by the graph here, before the step's updates. Trainable sources
            # of the tape are read at gradient() instead.
            state = [(name, var) for name, var in hook._tracked.items() if id(var) not in self.source_ids]
            hook._capture.offer(("tape_enter",), state)

    def _begin_step_from_graph(self) -> None:
        hook = self.hook
        hook._graph_driven = True
        try:
            hook.begin_step()
        finally:
            hook._graph_driven = False

    def gradient(self, target, sources, grads) -> None:
        hook, weights = self.hook, self.hook._weights
        flat_sources = keras.tree.flatten(sources)
        flat_grads = keras.tree.flatten(grads) if grads is not None else []
        # model.variables also lists a Dropout's RNG state: a source with no gradient, no weight.
        variables = [v for v in flat_sources if looks_like_variable(v) and not naming.is_rng_state(v)]
        newly_seen = [v for v in variables if id(v) not in weights.names]
        named = []
        if len(flat_sources) == len(flat_grads):
            named = [(naming.gradient_name(v), g) for v, g in zip(flat_sources, flat_grads)
                     if g is not None and looks_like_variable(v)]
        for var in variables:
            weights.variable_name(var)  # tracked from now on: read when each step begins
            self.source_ids.add(id(var))
        targets = keras.tree.flatten(target)
        if len(targets) == 1:
            register_names(hook.session, ["loss"], [K.LOSSES])
            named.append(("loss", targets[0]))
        if not executing_eagerly() and not in_xla_context():
            # Steps begin inside this graph (see entered), so the graph reads the sources
            # here, before the optimizer's update of the same variables. Under XLA, steps
            # begin from Python, which reads them (eagerly) when the step begins.
            named += [(weights.names[id(v)], v) for v in variables]
        hook._capture.offer(("tape",), named)
        session = hook.session
        if newly_seen and session.saving_step and hook._step_active and not hook._graph_driven:
            # Sources met for the first time were not known when this step (begun from
            # Python) began; they have not been updated yet, so they are this step's values.
            import tensorflow as tf

            with tf.init_scope():
                for var in newly_seen:
                    name = weights.names[id(var)]
                    if session.plans.wants(name):
                        session.inbox.record(name, var)


_TAPE_CLASSES: Dict[type, type] = {}


def hooked_tape_class(base: type) -> type:
    """A subclass of the tape's class whose enter/gradient also drive the hook."""
    cls = _TAPE_CLASSES.get(base)
    if cls is not None:
        return cls

    class HookedTape(base):
        def __enter__(self):
            hook = self._smdebug_hook()
            if hook is not None and hook.session.enabled:
                with hook.guard("wrap_tape enter"):
                    hook._tape.entered()
            return super().__enter__()

        def gradient(self, target, sources, *args, **kwargs):
            grads = super().gradient(target, sources, *args, **kwargs)
            hook = self._smdebug_hook()
            if hook is not None and hook.session.enabled:
                with hook.guard("wrap_tape gradient"):
                    hook._tape.gradient(target, sources, grads)
            return grads

    HookedTape.__name__ = HookedTape.__qualname__ = f"SmdebugHooked{base.__name__}"
    _TAPE_CLASSES[base] = cls = HookedTape
    return cls


# ============================================================================ layers and model I/O
class KerasLayers:
    """Layer tensors (``coll.add_keras_layer``, the ``layers`` collection) through the layers'
    ``call``, and the model's inputs, labels and predictions through its ``compute_loss`` and
    ``predict_step``: only what the configuration can save is wrapped."""

    def __init__(self, hook):
        self.hook = hook

    def patch(self, model) -> bool:
        """Wrap what ``model`` needs; whether anything new was wrapped."""
        changed = self._patch_layers(model)
        return self._patch_model_io(model) or changed

    def _patch_layers(self, model) -> bool:
        hook = self.hook
        requests: Dict[int, Tuple[object, Dict[str, List[Optional[str]]]]] = {}  # id -> (layer, kind -> collections)

        def want(layer, kind, collection):
            entry = requests.setdefault(id(layer), (layer, {"inputs": [], "outputs": []}))
            if collection not in entry[1][kind]:
                entry[1][kind].append(collection)

        for coll in hook.session.collection_manager:
            for layer, inputs, outputs in coll.layer_requests:
                if inputs:
                    want(layer, "inputs", coll.name)
                if outputs:
                    want(layer, "outputs", coll.name)
        for layer in layers_of(model)[1:]:
            if type(layer).__name__ == "InputLayer":
                continue
            for kind in ("inputs", "outputs"):
                base = naming.layer_tensor_base(layer.name, kind)
                if hook._is_included(base, K.LAYERS) or hook._is_included(base + "_0", K.LAYERS):
                    want(layer, kind, K.LAYERS if K.LAYERS in hook.session.include_collections else None)
        changed = False
        for layer, kinds in requests.values():
            changed |= self._patch_layer(layer, kinds)
        return changed

    def _patch_layer(self, layer, kinds: Dict[str, List[Optional[str]]]) -> bool:
        patches = self.hook._patches
        existing = getattr(layer, "_smdebug_capture_kinds", None)
        if patches.has(layer, "call"):
            assert existing is not None  # set below when the layer was patched
            for kind, colls in kinds.items():
                for c in colls:
                    if c not in existing[kind]:
                        existing[kind].append(c)
            return False
        original = layer.call
        hook_ref = weakref.ref(self.hook)
        object.__setattr__(layer, "_smdebug_capture_kinds", kinds)

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            hook = hook_ref()
            if hook is not None and hook.session.enabled:
                with hook.guard(f"capturing layer {layer.name}"):
                    hook._layers.offer_layer(layer, args, kwargs, outputs)
            return outputs

        patches.set(layer, "call", call)
        return True

    def offer_layer(self, layer, args, kwargs, outputs) -> None:
        hook = self.hook
        kinds = layer._smdebug_capture_kinds
        named = []
        for kind, value in (("inputs", args[0] if args else kwargs.get("inputs")), ("outputs", outputs)):
            colls = kinds.get(kind) or []
            if not colls:
                continue
            tensors = [t for t in keras.tree.flatten(value) if is_tensor(t, hook._tf)]
            names = naming.numbered(naming.layer_tensor_base(layer.name, kind), len(tensors))
            register_names(hook.session, names, colls)
            named += list(zip(names, tensors))
        hook._capture.offer(("layer", id(layer)), named)

    def _io_included(self, base: str) -> bool:
        home = dict(_MODEL_IO)[base]
        return self.hook._is_included(base, home) or self.hook._is_included(base + "_0", home)

    def _patch_model_io(self, model) -> bool:
        if not any(self._io_included(base) for base, _ in _MODEL_IO):
            return False
        patches = self.hook._patches
        changed = False
        hook_ref = weakref.ref(self.hook)
        if not patches.has(model, "compute_loss") and hasattr(model, "compute_loss"):
            original = model.compute_loss
            signature = inspect.signature(original)

            @functools.wraps(original)
            def compute_loss(*args, **kwargs):
                hook = hook_ref()
                if hook is not None and hook.session.enabled:
                    with hook.guard("capturing model inputs/outputs"):
                        bound = signature.bind_partial(*args, **kwargs).arguments
                        hook._layers.offer_model_io(model, {"inputs": bound.get("x"), "labels": bound.get("y"),
                                                            "predictions": bound.get("y_pred")})
                return original(*args, **kwargs)

            patches.set(model, "compute_loss", compute_loss)
            changed = True
        if not patches.has(model, "predict_step") and hasattr(model, "predict_step"):
            original_predict = model.predict_step

            @functools.wraps(original_predict)
            def predict_step(*args, **kwargs):
                # predict_step(data); the JAX trainer's is predict_step(state, data): data comes last.
                hook = hook_ref()
                if hook is not None and hook.session.enabled:
                    with hook.guard("capturing model inputs"):
                        data = kwargs["data"] if "data" in kwargs else args[-1]
                        x = data[0] if isinstance(data, tuple) else data
                        hook._layers.offer_model_io(model, {"inputs": x})
                return original_predict(*args, **kwargs)

            patches.set(model, "predict_step", predict_step)
            changed = True
        return changed

    def offer_model_io(self, model, values: Dict[str, object]) -> None:
        hook = self.hook
        named = []
        homes = dict(_MODEL_IO)
        for base, value in values.items():
            if value is None or not self._io_included(base):
                continue
            tensors = [t for t in keras.tree.flatten(value) if is_tensor(t, hook._tf)]
            names = naming.numbered(base, len(tensors))
            register_names(hook.session, names, [homes[base]])
            named += list(zip(names, tensors))
        hook._capture.offer(("model_io", id(model)), named)


# ============================================================================ batch logs
class KerasLogs:
    """Keras' batch logs (losses and metrics) and ``predict``'s outputs, in the open step."""

    def __init__(self, hook):
        self.hook = hook
        self._keys: Dict[str, str] = {}  # Keras log key -> collection

    def record(self, logs, only=None, every_time: bool = False, batch: Optional[int] = None) -> None:
        """Save Keras' logs (losses, metrics) in the open step; ``every_time``: even where the
        save config skips the step (the ``val_*`` logs of an epoch come once, as in 1.0.34).
        ``batch``: the batch index Keras passed, saved as the ``batch`` metric as 1.0.34 did
        (Keras 3 dropped it from the logs; scripts count it among the metrics)."""
        hook = self.hook
        session = hook.session
        if not hook._step_active or not (session.saving_step or every_time):
            return  # before the copy below: most batches save nothing
        if batch is not None:
            logs = {**(logs or {}), "batch": batch}
        if not logs:
            return
        items = []
        for key, value in logs.items():
            if only is not None and not only(key):
                continue
            if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
                continue
            if key not in self._keys:
                coll = self._keys[key] = K.LOSSES if naming.is_loss_log(key) else K.METRICS
                register_names(session, [key], [coll])
            items.append((key, np.asarray(float(value))))
        if items and every_time:
            session.record_whatever_the_config(items)
        elif items:
            session.inbox.record_many(items)  # host values; keeps the names saved at this step

    def record_predictions(self, logs) -> None:
        """``predict``'s batch outputs, as ``predictions_<i>`` (``outputs``)."""
        hook = self.hook
        session = hook.session
        if session.saving_step and hook._step_active and logs and "outputs" in logs:
            tensors = [t for t in keras.tree.flatten(logs["outputs"]) if t is not None]
            names = naming.numbered("predictions", len(tensors))
            register_names(session, names, [K.OUTPUTS])
            for name, value in zip(names, tensors):
                if session.plans.wants(name):
                    session.inbox.record(name, hook._host_or_tensor(value))

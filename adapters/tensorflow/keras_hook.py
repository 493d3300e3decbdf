"""KerasHook: smdebug for Keras 3 ``fit``/``evaluate``/``predict`` and custom TF loops.

As a ``keras.callbacks.Callback``:

* every batch is one step: ``fit`` batches are TRAIN steps, the validation batches ``fit``
  runs are EVAL steps (not extra TRAIN steps), ``evaluate`` batches EVAL and ``predict``
  batches PREDICT steps; the global step counts all of them;
* ``losses`` and ``metrics`` come from the batch logs (``loss`` and ``*_loss`` keys are
  losses; the rest metrics). Keras reports the running mean over the epoch so far, which
  is what is saved. ``val_*`` values of ``fit`` are saved in the last EVAL step of that
  validation run, whatever the save config (as 1.0.34 did: they come once an epoch);
* ``weights``, ``biases`` and ``optimizer_variables`` are saved with the values the
  batch's forward and backward passes used: read when a saved step begins, except the
  trainable weights in TRAIN steps of a compiled fit, which the optimizer's ``apply``
  wrapper copies inside the train step before the update (once that train function has
  shown it does so; no read from Python at step begin);
* ``gradients`` (when included) are captured inside the compiled train step by wrapping
  the model optimizer's ``apply`` (public API; no user code); ``outputs`` / ``inputs``
  (``predictions``, ``labels``, ``inputs``) through the model's ``compute_loss`` and
  ``predict_step``; layer tensors (``coll.add_keras_layer``, the ``layers`` collection)
  through the layers' ``call``. Only what the configuration can save is wrapped, so the
  default configuration changes nothing in the compiled step. See :mod:`.capture` for how
  values leave ``tf.function``/XLA only on steps that save them;
* ``updates``: ``update/<weight name>``, after minus before the same ``apply`` (:mod:`.updates`);
* each kind of step runs its own compiled function (:mod:`.keras_functions`): steps that
  save nothing run the graph Keras would run without the hook, saved steps one that copies
  and reduces their tensors with no conditional around the work. A configuration with k
  kinds of saved steps traces k + 1 train functions, each once.

Custom loops: ``hook.wrap_tape(tf.GradientTape())`` (each entry of the tape begins a step;
its ``gradient`` saves the gradients, the target as ``loss`` and, on the first use, the
sources as weights) and ``hook.wrap_optimizer(optimizer)`` (gradients, and updates of the
weights a registered model or the tape named); both work eagerly and inside
``tf.function``. Use ``hook.set_mode`` to switch modes between steps.

Limits worth knowing:

* ``steps_per_execution=k``: Keras calls batch callbacks once per k batches, so one step
  covers k batches; captured tensors are those of the last batch of the k (weights are
  read when the step begins: those of its first batch).
* ``jit_compile=True`` (Keras' default on GPUs): captured tensors need shapes known when
  the step is compiled; a tensor with a dynamic dimension is skipped with a warning.
* A model whose custom ``train_step`` does not call ``compute_loss`` has no
  ``inputs``/``labels``/``predictions`` in fit; one that does not use its optimizer's
  ``apply``/``apply_gradients`` has no ``gradients``.
* ``tf.distribute.MirroredStrategy``: the hook saves once per replica set, the chief
  replica's values (the lexically first device, which names the worker: docs/format.md 1.2). Its
  gradients are that replica's local gradients, before the all-reduce (Keras scales each
  replica's loss by 1/replicas). ``include_workers="all"`` falls back to ``"one"``.
* A custom loop whose wrapped tape is entered inside a ``jit_compile`` function cannot
  begin steps there: call ``hook.begin_step()`` before each call.

Other Keras backends (``KERAS_BACKEND=torch``/``jax``): the callback part works the same
(steps, modes, logs, weights, optimizer variables); the optimizer and layer wrappers work
wherever Keras runs them eagerly (torch; JAX with ``run_eagerly=True``), values are copied
to numpy and reduced there. ``wrap_tape`` is TensorFlow-only. TensorFlow is not imported.
Under JAX, fit/evaluate/predict keep the current variable values in the trainer's state:
on saved steps the hook calls Keras' public ``model.jax_state_sync()`` before reading them.
What each backend captures in ``fit`` (docs/keras_backends.md):

==========================  ==========  =====  ==========================
collection                  TensorFlow  torch  JAX (jit / run_eagerly)
==========================  ==========  =====  ==========================
weights, biases             yes         yes    yes / yes
optimizer_variables         yes         yes    yes / yes
losses, metrics (logs)      yes         yes    yes / yes
gradients                   yes         yes    no (one warning) / yes
updates                     yes         yes    no (one warning) / yes
inputs, labels, predictions yes         yes    predict only / yes
layer inputs/outputs        yes         yes    no (one warning) / yes
==========================  ==========  =====  ==========================
"""
from __future__ import annotations

import functools
import inspect
import sys
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import keras

from smdebug.collections import CollectionKeys, as_name_list
from smdebug.exceptions import ConfigError
from smdebug.hook import takes_hook_arguments
from smdebug.capture.instrumentation import Patches
from smdebug.modes import ModeKeys

from . import naming
from .base import NO_NAMES, TFHookBase, logger
from .eager_capture import EagerCapture
from .updates import KERAS_PROFILE, KerasUpdates

K = CollectionKeys
#: The compiled function Keras' loop calls at each batch of a mode (looked up per batch).
_LOOP_FUNCTIONS = {ModeKeys.TRAIN: "train_function", ModeKeys.EVAL: "test_function",
                   ModeKeys.PREDICT: "predict_function"}
_MODEL_IO = (("inputs", K.INPUTS), ("labels", K.OUTPUTS), ("predictions", K.OUTPUTS))


def _keras_backend() -> str:
    return keras.backend.backend()


@takes_hook_arguments
class KerasHook(TFHookBase, keras.callbacks.Callback):
    """Saves tensors of a Keras 3 model; pass it in ``callbacks=`` of fit/evaluate/predict.

    Saved by default: ``losses``, ``metrics``, ``sm_metrics``.
    """

    profile = KERAS_PROFILE  # TensorFlow's, with the ``updates`` collection

    def __init__(self, *args, **kwargs):
        # Keras' and this adapter's state first, then the session (TFHookBase.__init__).
        keras.callbacks.Callback.__init__(self)
        self._tf = _keras_backend() == "tensorflow"
        self._step_functions = None
        self._updates = KerasUpdates(self, self._tf)
        if self._tf:
            from .capture import GraphCapture
            from .keras_functions import StepFunctions

            self._capture = GraphCapture(self)
            self._step_functions = StepFunctions(self._capture)
        else:
            self._capture = EagerCapture(self)
        # The model attribute of the compiled function the batch beginning now runs (None
        # when a step begins outside Keras' loops: a custom loop).
        self._batch_function: Optional[str] = None
        self._patches = Patches()
        self._weight_names: Dict[int, str] = {}  # id(variable) -> saved name
        self._log_keys: Dict[str, str] = {}  # Keras log key -> collection
        self._in_fit = False
        self._models: List[object] = []
        # Models registered before they had weights (built lazily, at their first batch):
        # scanned again at step boundaries until they have some.
        self._unbuilt: List[object] = []
        self._unbuilt_optimizers: List[object] = []
        self._tape_source_ids: set = set()
        # (model, its train_function, weight names): the optimizer site of that compiled train
        # function copied these trainable weights in a saved TRAIN step of fit; see _delivered_by_sites.
        self._site_weights: Optional[tuple] = None
        # (site.fresh, len(self._tracked), names) of the last check: the same variants ran
        # again, and no variable was tracked since, so the same names (see _confirm_site_weights).
        self._fresh_names: Optional[tuple] = None
        TFHookBase.__init__(self, *args, **kwargs)

    # ====================================================================== registration
    def set_model(self, model):
        """Keras calls this when the hook is passed to fit/evaluate/predict; call it yourself
        in a custom loop to name variables by layer and capture layer tensors."""
        keras.callbacks.Callback.set_model(self, model)
        if not self.session.enabled:
            return
        with self.guard("set_model"):
            self._register_model(model)

    def register_model(self, model) -> None:
        """smdebug 1.0.34's name for :meth:`set_model`: name variables by layer and capture
        the layers' tensors of ``model`` (for custom loops; ``fit`` does it itself)."""
        self.set_model(model)

    def _register_model(self, model) -> None:
        if self._tf:
            self._adopt_strategy(getattr(model, "_distribute_strategy", None))
        if not any(m is model for m in self._models):
            self._models.append(model)
        self._scan_variables(model)
        if not model.weights and not any(m is model for m in self._unbuilt):
            self._unbuilt.append(model)
        changed = False
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and self._wants_optimizer_site(model):
            changed |= self._patch_optimizer(optimizer)
        changed |= self._patch_layers(model)
        changed |= self._patch_model_io(model)
        if changed:
            # Compiled steps traced before the wrappers existed do not contain them.
            for attr in ("train_function", "test_function", "predict_function"):
                if getattr(model, attr, None) is not None:
                    setattr(model, attr, None)

    def _layers_of(self, model) -> list:
        flatten = getattr(model, "_flatten_layers", None)
        if callable(flatten):
            return list(flatten(include_self=True, recursive=True))
        return [model] + list(getattr(model, "layers", []))

    def _scan_variables(self, model) -> None:
        """Name every model and optimizer variable and track the ones that can be saved."""
        owner: Dict[int, str] = {}
        for layer in self._layers_of(model):  # breadth-first: inner layers come later and win
            for var in getattr(layer, "weights", []):
                owner[id(var)] = layer.name
        for var in model.weights:
            name = naming.model_weight_name(owner.get(id(var), model.name), var)
            self._weight_names[id(var)] = name
            self._track(name, var, K.BIASES if naming.is_bias(var) else K.WEIGHTS)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            self._scan_optimizer(optimizer)
        for coll in list(self.session.collection_manager):
            for obj in list(coll.framework_objects):
                if _looks_like_variable(obj):
                    self._track(self._variable_name(obj), obj, coll.name)

    def _scan_optimizer(self, optimizer) -> None:
        for var in getattr(optimizer, "variables", []) or []:
            self._track(naming.optimizer_variable_name(var), var, K.OPTIMIZER_VARIABLES)
        if not getattr(optimizer, "built", True) and not any(o is optimizer for o in self._unbuilt_optimizers):
            # Its slots (momentum, velocity) appear when it is built, in the first train step.
            self._unbuilt_optimizers.append(optimizer)

    def _variable_name(self, var) -> str:
        name = self._weight_names.get(id(var))
        if name is None:
            name = self._weight_names[id(var)] = naming.loose_weight_name(var)
            self._track(name, var, K.BIASES if naming.is_bias(var) else K.WEIGHTS)
        return name

    def _wants_optimizer_site(self, model) -> bool:
        """Whether the optimizer's ``apply`` is wrapped: for gradients, and for trainable
        weights, which the wrapper copies in the compiled train step before the update.

        A model not built yet (a ``Sequential`` without an ``Input``, a subclassed model
        not called before ``fit``) has no weights to ask about, and fit traces its train
        step before they exist: the site is wrapped then (it keeps only what is included)."""
        if not model.weights:
            return True
        return self._updates.wanted_for(model.trainable_weights) or \
            any(self._is_included(naming.gradient_name(v), K.GRADIENTS) or
                self._is_included(self._weight_names.get(id(v), "")) for v in model.trainable_weights)

    # ====================================================================== wrappers
    def wrap_optimizer(self, optimizer):
        """Capture the gradients this Keras 3 optimizer applies (``gradients`` collection)
        and what its ``apply`` does to the named weights (``updates``).

        Returns the same optimizer. Works eagerly, in ``tf.function`` and with XLA.
        """
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ConfigError(
                f"wrap_optimizer takes a Keras 3 optimizer (keras.optimizers.Optimizer), got "
                f"{type(optimizer).__name__}; for tf.compat.v1 optimizers use smd.SessionHook.wrap_optimizer")
        if self.session.enabled:
            self._patch_optimizer(optimizer)
            self._scan_optimizer(optimizer)
        return optimizer

    def _patch_optimizer(self, optimizer) -> bool:
        if self._patches.has(optimizer, "apply"):
            return False
        original = optimizer.apply
        hook_ref = weakref.ref(self)

        @functools.wraps(original)
        def apply(grads, trainable_variables=None):
            hook, pending = hook_ref(), None
            if hook is not None and hook.session.enabled:
                with hook.guard("capturing gradients"):
                    pending = hook._offer_gradients(optimizer, grads, trainable_variables)
            result = original(grads, trainable_variables)
            if pending is not None and hook.session.enabled:
                hook._updates.after(pending)  # its own failure turns the updates off only
            return result

        self._patches.set(optimizer, "apply", apply)
        return True

    def _offer_gradients(self, optimizer, grads, trainable_variables):
        """Offer the gradients and weights before ``apply``; returns what the updates need after it."""
        self._scan_optimizer(optimizer)  # slots appear when the optimizer is built, possibly just now
        if self._unbuilt:  # built by this step's forward pass: its weights are named in time to be copied here
            self._scan_built_models()
        variables = list(trainable_variables) if trainable_variables is not None else \
            list(getattr(optimizer, "_trainable_variables", []) or [])
        grads = list(grads)
        if len(variables) != len(grads):
            return None
        named = [(naming.gradient_name(v), g) for v, g in zip(variables, grads) if g is not None]
        if self._tf and not _executing_eagerly():
            # Inside the train step the variables still hold the values of this step's
            # forward pass: copying them here spares fit the read when a step begins.
            for var in variables:
                name = self._weight_names.get(id(var))
                if name is not None and self._tracked.get(name) is var and self._is_included(name):
                    named.append((name, var))
        self._capture.offer(("optimizer", id(optimizer)), named)
        return self._updates.before(optimizer, variables)

    def wrap_tape(self, tape):
        """Make a ``tf.GradientTape`` save steps: entering it begins a step, and its
        ``gradient(target, sources)`` saves the gradients (``gradients/<var>Grad``), the
        target (``loss``) and the sources' values before the update (``weights``)."""
        if not self._tf:
            raise ConfigError("wrap_tape needs the TensorFlow Keras backend (KERAS_BACKEND=tensorflow); "
                              f"this process uses {_keras_backend()!r}")
        import tensorflow as tf

        if not isinstance(tape, tf.GradientTape):
            raise ConfigError(f"wrap_tape takes a tf.GradientTape, got {type(tape).__name__}")
        if getattr(tape, "_smdebug_hook", None) is not None:
            return tape
        tape.__class__ = _hooked_tape_class(type(tape))
        tape._smdebug_hook = weakref.ref(self)
        return tape

    def _tape_entered(self) -> None:
        if _executing_eagerly():
            self.begin_step()
            return
        if self._capture.begin_step_in_graph(self._begin_step_from_graph):
            # Python (the step's begin) runs unordered with the graph's variable updates, so
            # state is read by the graph here, before the step's updates. Trainable sources
            # of the tape are read at gradient() instead.
            state = [(name, var) for name, var in self._tracked.items() if id(var) not in self._tape_source_ids]
            self._capture.offer(("tape_enter",), state)

    def _begin_step_from_graph(self) -> None:
        self._graph_driven = True
        try:
            self.begin_step()
        finally:
            self._graph_driven = False

    def _tape_gradient(self, target, sources, grads) -> None:
        flat_sources = keras.tree.flatten(sources)
        flat_grads = keras.tree.flatten(grads) if grads is not None else []
        variables = [v for v in flat_sources if _looks_like_variable(v)]
        newly_seen = [v for v in variables if id(v) not in self._weight_names]
        named = []
        if len(flat_sources) == len(flat_grads):
            named = [(naming.gradient_name(v), g) for v, g in zip(flat_sources, flat_grads)
                     if g is not None and _looks_like_variable(v)]
        for var in variables:
            self._variable_name(var)  # tracked from now on: read when each step begins
            self._tape_source_ids.add(id(var))
        targets = keras.tree.flatten(target)
        if len(targets) == 1:
            self._register_names(["loss"], [K.LOSSES])
            named.append(("loss", targets[0]))
        if not _executing_eagerly() and not in_xla_context():
            # Steps begin inside this graph (see _tape_entered), so the graph reads the
            # sources here, before the optimizer's update of the same variables. Under XLA,
            # steps begin from Python, which reads them (eagerly) when the step begins.
            named += [(self._weight_names[id(v)], v) for v in variables]
        self._capture.offer(("tape",), named)
        if newly_seen and self.session.saving_step and self._step_active and not self._graph_driven:
            # Sources met for the first time were not known when this step (begun from
            # Python) began; they have not been updated yet, so they are this step's values.
            import tensorflow as tf

            with tf.init_scope():
                for var in newly_seen:
                    name = self._weight_names[id(var)]
                    if self.session.plans.wants(name):
                        self.session.inbox.record(name, var)

    def _patch_layers(self, model) -> bool:
        requests: Dict[int, Tuple[object, Dict[str, List[str]]]] = {}  # id -> (layer, kind -> collections)

        def want(layer, kind, collection):
            entry = requests.setdefault(id(layer), (layer, {"inputs": [], "outputs": []}))
            if collection not in entry[1][kind]:
                entry[1][kind].append(collection)

        for coll in self.session.collection_manager:
            for layer, inputs, outputs in coll.layer_requests:
                if inputs:
                    want(layer, "inputs", coll.name)
                if outputs:
                    want(layer, "outputs", coll.name)
        for layer in self._layers_of(model)[1:]:
            if type(layer).__name__ == "InputLayer":
                continue
            for kind in ("inputs", "outputs"):
                base = naming.layer_tensor_base(layer.name, kind)
                if self._is_included(base, K.LAYERS) or self._is_included(base + "_0", K.LAYERS):
                    want(layer, kind, K.LAYERS if K.LAYERS in self.session.include_collections else None)
        changed = False
        for layer, kinds in requests.values():
            changed |= self._patch_layer(layer, kinds)
        return changed

    def _patch_layer(self, layer, kinds: Dict[str, List[Optional[str]]]) -> bool:
        existing = getattr(layer, "_smdebug_capture_kinds", None)
        if self._patches.has(layer, "call"):
            for kind, colls in kinds.items():
                for c in colls:
                    if c not in existing[kind]:
                        existing[kind].append(c)
            return False
        original = layer.call
        hook_ref = weakref.ref(self)
        object.__setattr__(layer, "_smdebug_capture_kinds", kinds)

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            hook = hook_ref()
            if hook is not None and hook.session.enabled:
                with hook.guard(f"capturing layer {layer.name}"):
                    hook._offer_layer(layer, args, kwargs, outputs)
            return outputs

        self._patches.set(layer, "call", call)
        return True

    def _offer_layer(self, layer, args, kwargs, outputs) -> None:
        kinds = layer._smdebug_capture_kinds
        named = []
        for kind, value in (("inputs", args[0] if args else kwargs.get("inputs")), ("outputs", outputs)):
            colls = kinds.get(kind) or []
            if not colls:
                continue
            tensors = [t for t in keras.tree.flatten(value) if self._is_tensor(t)]
            names = naming.numbered(naming.layer_tensor_base(layer.name, kind), len(tensors))
            self._register_names(names, colls)
            named += list(zip(names, tensors))
        self._capture.offer(("layer", id(layer)), named)

    def _model_io_included(self, base: str) -> bool:
        home = dict(_MODEL_IO)[base]
        return self._is_included(base, home) or self._is_included(base + "_0", home)

    def _patch_model_io(self, model) -> bool:
        if not any(self._model_io_included(base) for base, _ in _MODEL_IO):
            return False
        changed = False
        hook_ref = weakref.ref(self)
        if not self._patches.has(model, "compute_loss") and hasattr(model, "compute_loss"):
            original = model.compute_loss
            signature = inspect.signature(original)

            @functools.wraps(original)
            def compute_loss(*args, **kwargs):
                hook = hook_ref()
                if hook is not None and hook.session.enabled:
                    with hook.guard("capturing model inputs/outputs"):
                        bound = signature.bind_partial(*args, **kwargs).arguments
                        hook._offer_model_io(model, {"inputs": bound.get("x"), "labels": bound.get("y"),
                                                     "predictions": bound.get("y_pred")})
                return original(*args, **kwargs)

            self._patches.set(model, "compute_loss", compute_loss)
            changed = True
        if not self._patches.has(model, "predict_step") and hasattr(model, "predict_step"):
            original_predict = model.predict_step

            @functools.wraps(original_predict)
            def predict_step(*args, **kwargs):
                # predict_step(data); the JAX trainer's is predict_step(state, data): data comes last.
                hook = hook_ref()
                if hook is not None and hook.session.enabled:
                    with hook.guard("capturing model inputs"):
                        data = kwargs["data"] if "data" in kwargs else args[-1]
                        x = data[0] if isinstance(data, tuple) else data
                        hook._offer_model_io(model, {"inputs": x})
                return original_predict(*args, **kwargs)

            self._patches.set(model, "predict_step", predict_step)
            changed = True
        return changed

    def _offer_model_io(self, model, values: Dict[str, object]) -> None:
        named = []
        homes = dict(_MODEL_IO)
        for base, value in values.items():
            if value is None or not self._model_io_included(base):
                continue
            tensors = [t for t in keras.tree.flatten(value) if self._is_tensor(t)]
            names = naming.numbered(base, len(tensors))
            self._register_names(names, [homes[base]])
            named += list(zip(names, tensors))
        self._capture.offer(("model_io", id(model)), named)

    def _register_names(self, names: Sequence[str], collections: Sequence[Optional[str]]) -> None:
        for coll_name in collections:
            if coll_name is None:
                continue
            coll = self.session.collection_manager.get(coll_name)
            known = coll.tensor_names
            for name in names:
                if name not in known:
                    coll.add_tensor_name(name)

    def _is_tensor(self, value) -> bool:
        if self._tf:
            from .backend import is_tf_value

            return is_tf_value(value)
        try:
            if not keras.ops.is_tensor(value):
                return False
        except Exception:  # noqa: BLE001 - a value Keras cannot classify is not a tensor here
            return False
        device = getattr(value, "device", None)
        return getattr(device, "type", None) != "meta"  # torch's shape-only tensors (symbolic build)

    def _read_variables(self, variables):
        if self._tf:
            from .backend import read_variables

            return read_variables(variables)
        for model in self._models:
            # JAX: inside fit/evaluate/predict the current values live in the trainer's state,
            # not in the variables; Keras' public jax_state_sync() puts them back (saved steps only).
            sync = getattr(model, "jax_state_sync", None)
            if callable(sync):
                sync()
        return [self._host_or_tensor(v) for v in variables]

    def _host_or_tensor(self, value):
        if self._tf or isinstance(value, (np.ndarray, np.generic, int, float)):
            return value
        return keras.ops.convert_to_numpy(value)

    # ====================================================================== save API in graphs
    def save_tensor(self, tensor_name, tensor_value, collections_to_write="default"):
        """Save a tensor in the given collection(s); works eagerly and inside tf.function."""
        if self._tf and not _executing_eagerly() and self.session.enabled:
            if not isinstance(tensor_name, str) or not tensor_name:
                raise ConfigError(f"tensor_name must be a non-empty string, got {tensor_name!r}")
            names = as_name_list(collections_to_write, "collections_to_write")
            for coll_name in names:
                self.session.include(coll_name, expect=False)
            self._register_names([tensor_name], names)
            self._capture.offer(("save_tensor", tensor_name), [(tensor_name, tensor_value)])
            return
        super().save_tensor(tensor_name, self._host_or_tensor(tensor_value) if not self._tf else tensor_value,
                            collections_to_write)

    def save_scalar(self, name, value, sm_metric: bool = False, timestamp: Optional[float] = None):
        """Save a scalar as ``scalar/<name>`` in the current step (eagerly or inside tf.function)."""
        if self._tf and not _executing_eagerly() and self.session.enabled:
            import tensorflow as tf

            if in_xla_context():
                logger.warning("smdebug: save_scalar(%r) inside a jit_compile function is ignored", name)
                return
            hook_ref = weakref.ref(self)

            def save(v):
                hook = hook_ref()
                if hook is not None:
                    hook.save_scalar(name, v.numpy(), sm_metric=sm_metric, timestamp=timestamp)
                return True

            tf.py_function(save, [value], Tout=tf.bool, name="smdebug_save_scalar")
            return
        if not self._tf and value is not None and not isinstance(value, (int, float, np.ndarray, np.generic)):
            value = self._host_or_tensor(value)
        super().save_scalar(name, value, sm_metric=sm_metric, timestamp=timestamp)

    # ====================================================================== weights from the train step
    def _delivered_by_sites(self) -> frozenset:
        """Trainable weights the optimizer site copies in this step, not read when it begins.

        Only in a TRAIN step of fit whose compiled train function is the one in which the
        site already copied them (confirmed at the end of an earlier saved step), one batch
        per step. Everything else (EVAL/PREDICT steps, a new or eager train function,
        ``steps_per_execution > 1``, custom loops) reads them when the step begins.
        """
        confirmed = self._site_weights
        if confirmed is None or self.session.mode != ModeKeys.TRAIN or not self._in_fit or self._graph_driven:
            return NO_NAMES
        model, function, names = confirmed
        current = self.model
        if current is not model or getattr(current, "train_function", None) is not function or \
                getattr(current, "steps_per_execution", 1) != 1:
            return NO_NAMES
        return names

    def _confirm_site_weights(self) -> None:
        """After a saved TRAIN step of fit: which trainable weights the optimizer site copied."""
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        site = self._capture.site(("optimizer", id(optimizer))) if optimizer is not None else None
        if site is None or not site.armed:
            return  # the site did not try to copy in this step: nothing learned
        tracked, fresh, cached = self._tracked, site.fresh, self._fresh_names
        if cached is not None and cached[0] == fresh and cached[1] == len(tracked):  # names are only ever added
            names = cached[2]
        else:
            # A variant of a specialized function copies only what its layout holds.
            names = frozenset(name for variant in fresh for name, entry in zip(variant.names, variant.layout)
                              if name in tracked and (variant.owner is None or entry is not None))
            self._fresh_names = (fresh, len(tracked), names)
        if not names:
            self._site_weights = None  # armed but did not run: back to reading at step begin
            return
        function = getattr(model, "train_function", None)
        previous = self._site_weights
        if previous is not None and previous[0] is model and previous[1] is function and previous[2] == names:
            return  # unchanged: keep the same objects (their identity keys caches)
        self._site_weights = (model, function, names)

    def on_step_end(self) -> None:
        session = self.session
        if self._unbuilt or self._unbuilt_optimizers:
            with self.guard("scanning a model built at its first batch"):
                self._scan_built_models()  # built by the batch that just ran: saved from the next step
        confirm = self._tf and self._in_fit and self._step_active and session.enabled and session.saving_step and \
            session.mode == ModeKeys.TRAIN and self.model is not None
        super().on_step_end()  # the capture sites' tensors
        if confirm and session.enabled:
            try:
                self._confirm_site_weights()
            except Exception as exc:  # noqa: BLE001 - the hook never stops training
                self._site_weights = None
                session.disable(f"end of step: {type(exc).__name__}: {exc}")

    # ====================================================================== callbacks
    def _scan_built_models(self) -> None:
        """Name and track the weights of models, and the slots of optimizers, that were built
        after set_model (a ``Sequential`` without an ``Input`` builds at its first batch, an
        optimizer at its first ``apply``)."""
        models = [model for model in self._unbuilt if model.weights]
        optimizers = [optimizer for optimizer in self._unbuilt_optimizers if getattr(optimizer, "built", True)]
        if not (models or optimizers):  # called at every step boundary until they are built
            return
        before = set(self._tracked)
        for model in models:
            self._unbuilt.remove(model)
            self._scan_variables(model)
        for optimizer in optimizers:
            self._unbuilt_optimizers.remove(optimizer)
            self._scan_optimizer(optimizer)
        for name in self._tracked:
            if name not in before:
                self.session.plans.plan_for(name)  # seen by now: no "matched nothing" warning for them

    def _start_step(self, mode: ModeKeys) -> None:
        if self._step_active:
            self.end_step()
        if self._unbuilt or self._unbuilt_optimizers:
            self._scan_built_models()
        if self.session.mode != mode:
            self.set_mode(mode)
        self._batch_function = _LOOP_FUNCTIONS[mode]
        try:
            self.begin_step()
        finally:
            self._batch_function = None

    def _choose_graphs(self) -> None:
        functions = self._step_functions
        if functions is None:
            return
        self._updates.arm()
        if self._batch_function is None or self.model is None or self._graph_driven:
            self._capture.running = None  # a custom loop's step: no specialized function runs
            return
        functions.install(self.model, self._batch_function, self.session.saving_collections)

    def _record_logs(self, logs, only=None, every_time: bool = False) -> None:
        """Save Keras' logs (losses, metrics) in the open step; ``every_time``: even where the
        save config skips the step (the ``val_*`` logs of an epoch come once, as in 1.0.34)."""
        if not logs or not self._step_active or not (self.session.saving_step or every_time):
            return
        items = []
        for key, value in logs.items():
            if only is not None and not only(key):
                continue
            if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
                continue
            if key not in self._log_keys:
                coll = self._log_keys[key] = K.LOSSES if naming.is_loss_log(key) else K.METRICS
                self._register_names([key], [coll])
            items.append((key, np.asarray(float(value))))
        if items and every_time:
            self.session.record_whatever_the_config(items)
        elif items:
            self.session.inbox.record_many(items)  # host values; keeps the names saved at this step

    def _guarded(self, where, fn, *args):
        if not self.session.enabled:
            return
        with self.guard(where):
            fn(*args)

    def _publish(self) -> None:
        self.session.publish()

    def on_train_begin(self, logs=None):
        self._in_fit = True

    def on_train_end(self, logs=None):
        self._in_fit = False
        self._guarded("on_train_end", self._finish)

    def on_epoch_end(self, epoch, logs=None):
        def body():
            if self._step_active and self.session.mode == ModeKeys.EVAL:
                self._record_logs(logs, only=lambda k: k.startswith("val_"), every_time=True)
            if self._step_active:
                self.end_step()

        self._guarded("on_epoch_end", body)

    def on_train_batch_begin(self, batch, logs=None):
        self._guarded("on_train_batch_begin", self._start_step, ModeKeys.TRAIN)

    def on_train_batch_end(self, batch, logs=None):
        self._guarded("on_train_batch_end", self._batch_end, logs, True)

    def on_test_batch_begin(self, batch, logs=None):
        self._guarded("on_test_batch_begin", self._start_step, ModeKeys.EVAL)

    def on_test_batch_end(self, batch, logs=None):
        # Inside fit the last EVAL step stays open for the val_* logs of on_epoch_end.
        self._guarded("on_test_batch_end", self._batch_end, logs, not self._in_fit)

    def on_test_end(self, logs=None):
        if not self._in_fit:
            self._guarded("on_test_end", self._finish)

    def on_predict_batch_begin(self, batch, logs=None):
        self._guarded("on_predict_batch_begin", self._start_step, ModeKeys.PREDICT)

    def on_predict_batch_end(self, batch, logs=None):
        def body():
            if self.session.saving_step and self._step_active and logs and "outputs" in logs:
                tensors = [t for t in keras.tree.flatten(logs["outputs"]) if t is not None]
                names = naming.numbered("predictions", len(tensors))
                self._register_names(names, [K.OUTPUTS])
                for name, value in zip(names, tensors):
                    if self.session.plans.wants(name):
                        self.session.inbox.record(name, self._host_or_tensor(value))
            self.end_step()
            self._stop_if_requested()

        self._guarded("on_predict_batch_end", body)

    def on_predict_end(self, logs=None):
        self._guarded("on_predict_end", self._finish)

    def _batch_end(self, logs, end: bool) -> None:
        self._record_logs(logs)
        if end:
            self.end_step()
        self._stop_if_requested()

    def _stop_if_requested(self) -> None:
        """A live rule's StopTraining (``request_stop``): Keras ends the loop after this batch."""
        model = self.model if self.session.stop_requested else None
        if model is None:
            return
        flag = {ModeKeys.TRAIN: "stop_training", ModeKeys.EVAL: "stop_evaluating",
                ModeKeys.PREDICT: "stop_predicting"}.get(self.session.mode)
        if flag is not None:
            setattr(model, flag, True)
        if self.session.mode == ModeKeys.EVAL and self._in_fit:
            model.stop_training = True

    def _finish(self) -> None:
        if self._step_active:
            self.end_step()
        self._publish()

    # ====================================================================== lifecycle
    def on_disabled(self, reason: str) -> None:
        super().on_disabled(reason)
        self._updates.disarm()
        if self._step_functions is not None:
            self._step_functions.restore()  # Keras' own functions, even in the middle of a fit

    def on_close(self) -> None:
        """The run is written: remove the wrappers from the model."""
        super().on_close()
        if self._step_functions is not None:
            self._step_functions.restore()
        self._patches.restore()
        for model in self._models:
            for attr in ("train_function", "test_function", "predict_function"):
                if getattr(model, attr, None) is not None:
                    try:
                        setattr(model, attr, None)
                    except Exception:  # noqa: BLE001 - a model that refuses keeps its compiled function
                        pass
        self._models = []


def _executing_eagerly() -> bool:
    import tensorflow as tf

    return tf.executing_eagerly()


def in_xla_context() -> bool:
    from .capture import in_xla_context as check

    return check()


def _looks_like_variable(obj) -> bool:
    if isinstance(obj, keras.Variable):
        return True
    tf = sys.modules.get("tensorflow")  # a tf.Variable implies TensorFlow is imported
    return tf is not None and isinstance(obj, tf.Variable)


_TAPE_CLASSES: Dict[type, type] = {}


def _hooked_tape_class(base: type) -> type:
    """A subclass of the tape's class whose enter/gradient also drive the hook."""
    cls = _TAPE_CLASSES.get(base)
    if cls is not None:
        return cls

    class HookedTape(base):
        def __enter__(self):
            hook = self._smdebug_hook()
            if hook is not None and hook.session.enabled:
                with hook.guard("wrap_tape enter"):
                    hook._tape_entered()
            return super().__enter__()

        def gradient(self, target, sources, *args, **kwargs):
            grads = super().gradient(target, sources, *args, **kwargs)
            hook = self._smdebug_hook()
            if hook is not None and hook.session.enabled:
                with hook.guard("wrap_tape gradient"):
                    hook._tape_gradient(target, sources, grads)
            return grads

    HookedTape.__name__ = HookedTape.__qualname__ = f"SmdebugHooked{base.__name__}"
    _TAPE_CLASSES[base] = cls = HookedTape
    return cls

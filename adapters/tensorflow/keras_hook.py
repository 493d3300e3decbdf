"""KerasHook: smdebug for Keras 3 ``fit``/``evaluate``/``predict`` and custom TF loops.

As a ``keras.callbacks.Callback``:

* every batch is one step: ``fit`` batches are TRAIN steps, the validation batches ``fit``
  runs are EVAL steps (not extra TRAIN steps), ``evaluate`` batches EVAL and ``predict``
  batches PREDICT steps; the global step counts all of them;
* ``losses`` and ``metrics`` come from the batch logs (``loss`` and ``*_loss`` keys are
  losses; the rest metrics), with the batch index as the ``batch`` metric (1.0.34's). Keras
  reports the running mean over the epoch so far, which is what is saved. Whatever the save
  config, as 1.0.34 wrote each epoch's logs: the last TRAIN batch of an epoch saves them,
  and ``val_*`` values of ``fit`` are saved in the last EVAL step of that validation run;
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

import weakref
from typing import TYPE_CHECKING, List, Optional, cast

import numpy as np

import keras

from smdebug.collections import CollectionKeys, as_name_list
from smdebug.exceptions import ConfigError
from smdebug.hook import takes_hook_arguments
from smdebug.capture.instrumentation import Patches
from smdebug.modes import ModeKeys

from .base import TFHookBase, logger
from .eager_capture import EagerCapture
from .keras_early_stopping import KerasEarlyStopping
from .keras_sites import KerasLayers, KerasLogs, KerasTape, hooked_tape_class, register_names
from .keras_weights import KerasWeights, in_xla_context
from .keras_weights import executing_eagerly as _executing_eagerly
from .updates import KERAS_PROFILE, KerasUpdates

if TYPE_CHECKING:
    from .capture import GraphCapture  # imported in __init__ only with the TensorFlow backend

K = CollectionKeys
#: The compiled function Keras' loop calls at each batch of a mode (looked up per batch).
_LOOP_FUNCTIONS = {ModeKeys.TRAIN: "train_function", ModeKeys.EVAL: "test_function",
                   ModeKeys.PREDICT: "predict_function"}


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
        self._in_fit = False
        self._models: List[object] = []
        # The participants: weights and the optimizer site, a custom loop's tape, layers and
        # model I/O, batch logs (keras_weights.py, keras_sites.py).
        self._weights = KerasWeights(self)
        self._tape = KerasTape(self)
        self._layers = KerasLayers(self)
        self._logs = KerasLogs(self)
        self._early_stopping = KerasEarlyStopping(self)  # fit's EarlyStopping, recorded with the run
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
        self._weights.scan_variables(model)
        changed = False
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and self._weights.wants_optimizer_site(model):
            changed |= self._weights.patch_optimizer(optimizer)
        changed |= self._layers.patch(model)
        if changed:
            # Compiled steps traced before the wrappers existed do not contain them.
            for attr in ("train_function", "test_function", "predict_function"):
                if getattr(model, attr, None) is not None:
                    setattr(model, attr, None)

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
            self._weights.patch_optimizer(optimizer)
            self._weights.scan_optimizer(optimizer)
        return optimizer

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
        tape.__class__ = hooked_tape_class(type(tape))
        tape._smdebug_hook = weakref.ref(self)
        return tape

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
            register_names(self.session, [tensor_name], names)
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
        """Trainable weights the optimizer site copies in this step (:meth:`.KerasWeights.delivered_by_sites`)."""
        return self._weights.delivered_by_sites()

    def on_step_end(self) -> None:
        session = self.session
        if self._weights.unbuilt or self._weights.unbuilt_optimizers:
            with self.guard("scanning a model built at its first batch"):
                self._weights.scan_built_models()  # built by the batch that just ran: saved from the next step
        confirm = self._tf and self._in_fit and self._step_active and session.enabled and session.saving_step and \
            session.mode == ModeKeys.TRAIN and self.model is not None
        super().on_step_end()  # the capture sites' tensors
        if confirm and session.enabled:
            try:
                self._weights.confirm_site_weights()
            except Exception as exc:  # noqa: BLE001 - the hook never stops training
                self._weights.site_weights = None
                session.disable(f"end of step: {type(exc).__name__}: {exc}")

    # ====================================================================== callbacks
    def _start_step(self, mode: ModeKeys) -> None:
        if self._step_active:
            self.end_step()
        if self._weights.unbuilt or self._weights.unbuilt_optimizers:
            self._weights.scan_built_models()
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
            # a custom loop's step: no specialized function runs (step functions come with a GraphCapture)
            cast("GraphCapture", self._capture).running = None
            return
        functions.install(self.model, self._batch_function, self.session.saving_collections)

    def _guarded(self, where, fn, *args):
        if not self.session.enabled:
            return
        with self.guard(where):
            fn(*args)

    def on_train_begin(self, logs=None):
        self._in_fit = True
        self._guarded("on_train_begin", self._early_stopping.begin)

    def on_train_end(self, logs=None):
        self._in_fit = False
        self._guarded("on_train_end", self._early_stopping.end)
        self._guarded("on_train_end", self._finish)

    def on_epoch_end(self, epoch, logs=None):
        def body():
            if self._step_active and self.session.mode == ModeKeys.EVAL:
                self._logs.record(logs, only=lambda k: k.startswith("val_"), every_time=True)
            self._early_stopping.epoch_end()  # the step the epoch's val_* logs are saved in
            if self._step_active:
                self.end_step()

        self._guarded("on_epoch_end", body)

    def on_train_batch_begin(self, batch, logs=None):
        self._guarded("on_train_batch_begin", self._start_step, ModeKeys.TRAIN)

    def on_train_batch_end(self, batch, logs=None):
        self._guarded("on_train_batch_end", self._batch_end, logs, True, batch, _ends_epoch(self.params, batch))

    def on_test_batch_begin(self, batch, logs=None):
        self._guarded("on_test_batch_begin", self._start_step, ModeKeys.EVAL)

    def on_test_batch_end(self, batch, logs=None):
        # Inside fit the last EVAL step stays open for the val_* logs of on_epoch_end.
        self._guarded("on_test_batch_end", self._batch_end, logs, not self._in_fit, batch)

    def on_test_end(self, logs=None):
        if not self._in_fit:
            self._guarded("on_test_end", self._finish)

    def on_predict_batch_begin(self, batch, logs=None):
        self._guarded("on_predict_batch_begin", self._start_step, ModeKeys.PREDICT)

    def on_predict_batch_end(self, batch, logs=None):
        def body():
            self._logs.record(logs, batch=batch)
            self._logs.record_predictions(logs)
            self.end_step()
            _stop_if_requested(self)

        self._guarded("on_predict_batch_end", body)

    def on_predict_end(self, logs=None):
        self._guarded("on_predict_end", self._finish)

    def _batch_end(self, logs, end: bool, batch=None, ends_epoch: bool = False) -> None:
        # The last batch of an epoch is always saved: 1.0.34 wrote each epoch's training logs
        # (Keras 3's last batch logs are the epoch's running means, the same values).
        self._logs.record(logs, batch=batch, every_time=ends_epoch)
        if end:
            self.end_step()
        _stop_if_requested(self)

    def _finish(self) -> None:
        if self._step_active:
            self.end_step()
        self.session.publish()

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


def _ends_epoch(params, batch) -> bool:
    """Whether this TRAIN batch is the last of its epoch (Keras' ``params["steps"]``; unknown
    for a dataset of unknown length until Keras counts it)."""
    steps = (params or {}).get("steps")
    return isinstance(steps, int) and isinstance(batch, int) and batch + 1 >= steps


def _stop_if_requested(hook) -> None:
    """A live rule's StopTraining (``request_stop``): Keras ends the loop after this batch."""
    session = hook.session
    model = hook.model if session.stop_requested else None
    if model is None:
        return
    flag = {ModeKeys.TRAIN: "stop_training", ModeKeys.EVAL: "stop_evaluating",
            ModeKeys.PREDICT: "stop_predicting"}.get(session.mode)
    if flag is not None:
        setattr(model, flag, True)
    if session.mode == ModeKeys.EVAL and hook._in_fit:
        model.stop_training = True

"""DebuggerCallback for the Hugging Face ``Trainer``: the PyTorch hook, driven by its events.

What is a step
    One TRAIN step per optimizer step (``on_step_begin`` to the step's end): with
    ``gradient_accumulation_steps=k`` the ``k`` micro-batches are one step. A TRAIN step's
    mode step is ``state.global_step`` at its start. Each forward pass of the model in
    evaluation mode (one per batch of ``Trainer.evaluate``, and of ``Trainer.predict``,
    which the Trainer's events do not tell apart from evaluation) is one EVAL step. The
    global step counts the steps of all modes.

What is recorded, and when
    * Weights and gradients (collections ``weights``, ``biases``, ``gradients``) in
      ``on_pre_optimizer_step``: the gradients accumulated over the step's micro-batches,
      after gradient clipping (``max_grad_norm``) and accelerate's unscaling, and the
      weights the step used. ``on_optimizer_step`` sees the same gradients, but the
      weights already updated: the next step's.
    * The step's loss as the tensor ``loss`` (``losses`` collection), as the Trainer
      computes (and logs) it from the model output's ``loss``: the sum over the step's
      micro-batches when the Trainer passed ``num_items_in_batch`` (the model then divided
      each by the items of the whole step), else their mean over the micro-batches the step
      ran; an EVAL step's, that batch's loss.
    * Scalars: what ``on_log`` receives (``loss``, ``learning_rate``, ``grad_norm``,
      ``eval_*``, ...) in the step being logged, and ``train/loss`` at those steps; with
      ``logging_strategy="epoch"``, in each epoch's last step; the training's summary
      (``train_loss``, ``train_runtime``...) in the last step, unless an evaluation ran after
      it (then no step is open for it).
    * Module outputs and inputs that collections ask for, through the PyTorch hook's module
      hooks (the Trainer's model, unwrapped, is registered).

Stopping
    A rule's ``StopTraining`` sets ``control.should_training_stop``: the Trainer ends
    training after the step the rule fired on. Under torch.distributed every rank stops at
    the same step, one step later (:class:`smdebug.pytorch.integration.StopVote`).

Distributed
    The hook is made at ``on_init_end``; ``TrainingArguments`` has set up the process group
    by then (accelerate, torchrun), so worker names are ``worker_<rank>`` as for the
    PyTorch hook.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers import TrainerCallback

from smdebug.logger import get_logger
from smdebug.modes import ModeKeys
from smdebug.pytorch import Hook
from smdebug.pytorch.integration import CallbackHook, is_distributed, loss_of

from ._early_stopping import TrainerEarlyStopping

logger = get_logger("smdebug.transformers")
class DebuggerCallback(CallbackHook, TrainerCallback):
    """Saves tensors of a ``transformers.Trainer`` run with smdebug.

    ``Trainer(..., callbacks=[DebuggerCallback(out_dir="/tmp/run", save_config=...)])``.

    Arguments: those of :class:`smdebug.pytorch.integration.CallbackHook` (the hook's
    arguments, ``json_config_path`` or ``hook``); the hook is made when the Trainer is built.
    For a Trainer the callback is added to after it was built (``trainer.add_callback``),
    call :meth:`attach` with ``trainer.model``. Steps and what is saved:
    :mod:`smdebug.transformers.callback`.
    """

    OWNER = "Transformers"

    def __init__(self, out_dir=None, *, json_config_path=None, hook: Optional[Hook] = None, **hook_kwargs):
        CallbackHook.__init__(self, out_dir, json_config_path=json_config_path, hook=hook, **hook_kwargs)
        self._model: Optional[torch.nn.Module] = None
        self._handles: list = []
        self._early_stopping = TrainerEarlyStopping(self)  # the Trainer's EarlyStoppingCallback, recorded with the run

    def attach(self, model: torch.nn.Module) -> None:
        """Make the hook (once) and watch ``model``, the Trainer's (unwrapped) model. It is
        registered with the hook later (:meth:`_register`): accelerate may still shard its
        parameters (FSDP replaces them) when the Trainer prepares it for training."""
        self._build()
        driver = self._active()
        if driver is None or model is None or model is self._model:
            return
        with driver.hook.guard("Transformers attach"):
            self._model = model
            # Ours run before the hook's own: an EVAL step begins before the forward it holds.
            self._handles.append(model.register_forward_pre_hook(self._on_forward_pre, prepend=True))
            self._handles.append(model.register_forward_hook(self._on_forward, with_kwargs=True))

    def _register(self, driver) -> None:
        """Register the model once the Trainer has prepared it: at the start of training, or
        at the first evaluation forward of a Trainer that only evaluates."""
        model = self._model
        if model is not None and not driver.hook.is_registered(model):
            driver.hook.register_module(model)

    def close(self) -> None:
        """Write the last step, finish the run's files and remove the model hooks (also at exit)."""
        while self._handles:
            self._handles.pop().remove()
        CallbackHook.close(self)

    # --- the model's forward passes -----------------------------------------------------------
    def _on_forward_pre(self, module, args) -> None:
        driver = self._active()
        if driver is not None and not module.training:
            with driver.hook.guard("Transformers evaluation forward"):
                self._register(driver)
                driver.begin(ModeKeys.EVAL)

    def _on_forward(self, module, args, kwargs, output) -> None:
        driver = self._active()
        if driver is not None and driver.open is not None:
            with driver.hook.guard("Transformers forward"):
                if driver.open[0] is ModeKeys.EVAL:
                    driver.add_loss(loss_of(output))
                elif kwargs.get("num_items_in_batch") is not None:
                    # The model divided its loss sum by the items of every micro-batch of the
                    # step (the Trainer passes their number): the step's loss is the sum.
                    driver.add_loss(loss_of(output))
                else:  # each micro-batch's own mean: the step's loss is their mean
                    driver.add_loss(loss_of(output), averaged=True)

    # --- Trainer events -------------------------------------------------------------------------
    def on_init_end(self, args, state, control, model=None, **kwargs):
        self.attach(model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.attach(model)
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Transformers registering the model"):
                self._register(driver)
                self._early_stopping.begin()

    def on_step_begin(self, args, state, control, **kwargs):
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Transformers on_step_begin"):
                driver.begin(ModeKeys.TRAIN, state.global_step)

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        driver = self._active()
        if driver is not None:
            driver.hook.capture_parameters(getattr(optimizer, "optimizer", optimizer))  # accelerate wraps it

    def on_step_end(self, args, state, control, **kwargs):
        driver = self._active()
        if driver is not None and driver.open is not None:
            with driver.hook.guard("Transformers on_step_end"):
                driver.finish(None, log_scalars=False)
                if not (control.should_log or self._last_of_epoch(state) or self._last_of_training(state)):
                    driver.end()  # else on_log comes next (the epoch's logs, the training's summary): its values
                    #                belong to this step; it ends it (or the next step, evaluation or close does)
        if self._stop_agreed():  # every rank votes, once per optimizer step
            self._stop(control)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        driver = self._active()
        if driver is None:
            return None
        with driver.hook.guard("Transformers on_log"):
            if driver.open is None:
                return None
            if driver.open[0] is ModeKeys.TRAIN and "loss" in (logs or {}):
                driver.hook.save_scalar("train/loss", float(logs["loss"]))
            driver.save_metrics(logs, only_changed=False)  # each on_log is a fresh report
            if driver.open[0] is ModeKeys.TRAIN and not self._last_of_training(state):
                driver.end()  # the last step stays open for the training's summary (on_train_end ends it)
        if driver.hook.stop_requested and not is_distributed():  # ranks stop together, at on_step_end's vote
            self._stop(control)
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        driver = self._active()
        if driver is not None and driver.open is not None and driver.open[0] is ModeKeys.EVAL:
            with driver.hook.guard("Transformers on_prediction_step"):
                driver.finish(None, log_scalars=False)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        driver = self._active()
        if driver is not None and driver.open is not None and driver.open[0] is ModeKeys.EVAL:
            with driver.hook.guard("Transformers on_evaluate"):
                self._early_stopping.evaluation_end(driver.hook)  # the step its eval_* metrics are saved in
        self._end_evaluation(None)  # the Trainer gave these metrics to on_log just before

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._end_evaluation(metrics)

    def on_train_end(self, args, state, control, **kwargs):
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Transformers on_train_end"):
                driver.end()
                self._early_stopping.end(args, state, driver.hook)
                driver.hook.flush()

    def _end_evaluation(self, metrics) -> None:
        driver = self._active()
        if driver is not None and driver.open is not None and driver.open[0] is ModeKeys.EVAL:
            with driver.hook.guard("Transformers end of evaluation"):
                if metrics:
                    driver.save_metrics(metrics, only_changed=False)
                driver.end()

    @staticmethod
    def _last_of_epoch(state) -> bool:
        """Whether the step that just ended an optimizer step ends an epoch (the Trainer logs
        the epoch's values next, with ``logging_strategy="epoch"``)."""
        return state.epoch is not None and float(state.epoch).is_integer()

    @staticmethod
    def _last_of_training(state) -> bool:
        return bool(state.max_steps) and state.global_step >= state.max_steps

    def _stop(self, control) -> None:
        if not control.should_training_stop:
            driver = self._driver
            assert driver is not None  # a stop is asked for only through a hook
            logger.warning("smdebug: stopping the Transformers Trainer: %s", driver.hook.stop_reason)
            control.should_training_stop = True

"""DebuggerCallback for PyTorch Lightning: the PyTorch hook, driven by the Trainer's loops.

What is a step
    One TRAIN step per optimizer step: with ``accumulate_grad_batches=k`` the ``k``
    micro-batches before an optimizer step are one step. A TRAIN step's mode step is
    ``trainer.global_step`` at its start (the index of the optimizer step it ends with).
    With manual optimization (``automatic_optimization = False``, several optimizers), one
    TRAIN step per training batch; Lightning counts each optimizer's step in
    ``global_step``, so two optimizers give mode steps 0, 2, 4, ...
    Each batch of a validation loop (``fit``'s validation and ``trainer.validate``) or of
    ``trainer.test`` is one EVAL step; each batch of ``trainer.predict`` one PREDICT step.
    The sanity check's validation batches are not steps (nothing was trained yet). The
    global step counts the steps of all modes. A validation that Lightning runs in the
    middle of an optimizer step's accumulation (``val_check_interval`` not a multiple of
    ``accumulate_grad_batches``) is not captured, with one warning: its EVAL steps would
    cut that TRAIN step in two.

What is recorded, and when
    * Weights and gradients (collections ``weights``, ``biases``, ``gradients``) in
      ``on_before_optimizer_step``: the gradients accumulated over the step's micro-batches,
      after AMP's unscaling and before gradient clipping (Lightning clips after this hook,
      in place: with ``gradient_clip_val`` set, they are read before the hook returns),
      and the weights the step's forward passes used. EVAL/PREDICT steps save weights only.
    * The step's loss as the tensor ``loss`` (``losses`` collection): the sum over its
      micro-batches of the loss ``training_step`` returned, as Lightning reports it
      (divided by ``accumulate_grad_batches``, so the sum is their mean; in an epoch's last
      step that runs fewer micro-batches, Lightning still divides by it, and so does the
      saved loss, as the gradients that step applies).
    * Scalars every ``trainer.log_every_n_steps`` optimizer steps: ``train/loss`` and the
      values in ``trainer.callback_metrics`` (what ``self.log`` logged) logged anew since
      last saved; after each validation/test loop, its metrics, in its last step; epoch-level
      values (``on_epoch=True``) in the epoch's last step when no validation runs between
      that step and the epoch's end (else at the next logging step).
    * Module outputs and inputs that collections ask for, through the PyTorch hook's
      module hooks (the LightningModule is registered as the model).

Stopping
    A rule's ``StopTraining`` sets ``trainer.should_stop``: the Trainer ends fit at the
    end of that batch (after ``min_steps``/``min_epochs``, as for any callback's stop).
    Under a distributed strategy every rank stops at the same optimizer step, one step
    later (:class:`smdebug.pytorch.integration.StopVote`).

Both Lightning packages
    ``pytorch_lightning`` and the unified ``lightning`` package (``import lightning as L``;
    ``lightning.pytorch``) are separate installs with separate ``Callback`` classes, and
    each Trainer accepts only its own. The callback derives from the ``Callback`` of each
    one installed, so one class serves both Trainers.

Distributed
    The hook is made in ``setup``, once the strategy has started the processes, so the
    worker name (``worker_<rank>``) and ``include_workers`` work as for the PyTorch hook.
"""
from __future__ import annotations

import importlib
from typing import Optional

from smdebug.logger import get_logger
from smdebug.modes import ModeKeys
from smdebug.pytorch import Hook
from smdebug.pytorch.integration import CallbackHook, loss_of, scalar_items

from ._early_stopping import LightningEarlyStopping

logger = get_logger("smdebug.lightning")
def _lightning_callback_classes() -> tuple:
    """``Callback`` of each Lightning package installed (see the module docstring)."""
    found = []
    for package in ("pytorch_lightning", "lightning.pytorch"):
        try:
            found.append(importlib.import_module(package).Callback)
        except ImportError:
            continue
    if not found:
        raise ModuleNotFoundError("smdebug.lightning needs PyTorch Lightning: pip install 'pytorch-lightning>=2.0' "
                                  "(smdebug-core's 'lightning' extra; or pip install lightning)",
                                  name="pytorch_lightning")
    return tuple(found)


# Its Callback bases are those of the Lightning packages installed, found at import time: mypy cannot
# check a class whose bases are computed, hence the ignore.
class DebuggerCallback(CallbackHook, *_lightning_callback_classes()):  # type: ignore[misc]
    """Saves tensors of a LightningModule's training with smdebug.

    ``Trainer(callbacks=[DebuggerCallback(out_dir="/tmp/run", save_config=...)])``.

    Arguments: those of :class:`smdebug.pytorch.integration.CallbackHook` (the hook's
    arguments, ``json_config_path`` or ``hook``); the hook is made when the Trainer sets up.
    See :mod:`smdebug.lightning.callback` for steps, modes and what is saved.
    """

    OWNER = "Lightning"

    def __init__(self, out_dir=None, *, json_config_path=None, hook: Optional[Hook] = None, **hook_kwargs):
        CallbackHook.__init__(self, out_dir, json_config_path=json_config_path, hook=hook, **hook_kwargs)
        self._metrics_before_loop: dict = {}  # trainer.callback_metrics when a validation/test loop started
        # A validation run inside a half-accumulated optimizer step (set while it runs); warned once.
        self._validation_skipped = False
        self._warned_mid_accumulation = False
        self._voted_at = 0  # trainer.global_step at the last stop vote (every rank votes at each optimizer step)
        self._epoch_values: dict = {}  # the epoch-level metrics saved at the last epoch's end: name -> value
        self._early_stopping = LightningEarlyStopping()  # the trainer's EarlyStopping, recorded with the run

    # --- set-up -----------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._build()  # here: the strategy has started the processes, so the rank is known

    def _register(self, trainer) -> None:
        """Register the LightningModule once the strategy has set it up: after
        ``configure_model`` and after sharding (FSDP replaces the parameters; registered
        earlier, the hook would keep the unsharded ones)."""
        driver = self._active()
        module = trainer.lightning_module
        if driver is not None and module is not None and not driver.hook.is_registered(module):
            with driver.hook.guard("Lightning registering the model"):
                driver.hook.register_module(module)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._register(trainer)
        self._early_stopping.begin()

    def on_predict_start(self, trainer, pl_module) -> None:
        self._register(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Lightning teardown"):
                driver.end()
                driver.hook.flush()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Training failed or was interrupted: the steps so far are written (the user's exception
        # propagates), without collectives the other ranks may never reach.
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Lightning on_exception"):
                driver.hook.step_failed()
        self.teardown(trainer, pl_module, "exception")

    # --- training -----------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        driver = self._active()
        if driver is None:
            return
        with driver.hook.guard("Lightning on_train_batch_start"):
            step = trainer.global_step
            if not driver.is_open(ModeKeys.TRAIN, step):  # else: the same optimizer step goes on (accumulation)
                driver.begin(ModeKeys.TRAIN, step, log_scalars=self._logs_at(trainer, step))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        driver = self._active()
        if driver is not None:
            # Lightning clips gradients in place right after this hook: read them first then.
            driver.hook.capture_parameters(getattr(optimizer, "optimizer", optimizer),  # LightningOptimizer wraps it
                                           wait_for_gradients=bool(trainer.gradient_clip_val))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        driver = self._active()
        if driver is not None and driver.open is not None:
            with driver.hook.guard("Lightning on_train_batch_end"):
                driver.add_loss(loss_of(outputs))
                step = driver.open[1]
                if step is not None and trainer.global_step > step:  # the optimizer stepped: the step is complete
                    logs = self._logs_at(trainer, step)
                    # callback_metrics is computed on access: only at logging steps
                    driver.finish(self._new_metrics(trainer) if logs else None, log_scalars=logs)
                    if not trainer.is_last_batch:  # the epoch's last step stays open for its epoch-level metrics
                        driver.end()  # now, so that a rule's verdict on this step can stop the trainer at once
        if trainer.global_step != self._voted_at:  # once per optimizer step, on every rank
            self._voted_at = trainer.global_step
            if self._stop_agreed() and not trainer.should_stop:
                driver = self._driver
                assert driver is not None  # _stop_agreed() is False without one
                logger.warning("smdebug: stopping the Lightning Trainer: %s", driver.hook.stop_reason)
                trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # self.log(..., on_epoch=True) values are reduced now: saved in the epoch's last step.
        driver = self._active()
        if driver is not None and driver.open is not None and driver.open[0] is ModeKeys.TRAIN:
            with driver.hook.guard("Lightning on_train_epoch_end"):
                metrics = self._new_metrics(trainer)
                driver.save_metrics(metrics)
                self._epoch_values = {name: float(value) for name, value in scalar_items(metrics)}
                driver.end()
        if driver is not None:
            with driver.hook.guard("Lightning on_train_epoch_end"):
                self._early_stopping.train_epoch_end(trainer, driver.hook)

    def _new_metrics(self, trainer) -> dict:
        """``trainer.callback_metrics`` less the epoch-level values saved at the last epoch's
        end, which Lightning reports again (as new objects) until the next epoch ends."""
        metrics = trainer.callback_metrics
        seen = self._epoch_values
        if not seen:
            return metrics
        values = dict(scalar_items({name: metrics[name] for name in seen if name in metrics}))
        return {name: value for name, value in metrics.items() if name not in seen or values.get(name) != seen[name]}

    @staticmethod
    def _logs_at(trainer, step: int) -> bool:
        """Whether the TRAIN step before optimizer step ``step`` saves its scalars (Lightning's log interval)."""
        return step % max(trainer.log_every_n_steps, 1) == 0

    def on_train_end(self, trainer, pl_module) -> None:
        self._end_loop("on_train_end", None)
        driver = self._active()
        if driver is not None:
            with driver.hook.guard("Lightning recording early stopping"):
                self._early_stopping.end(trainer, driver.hook)

    # --- evaluation and prediction ----------------------------------------------------------
    def on_validation_start(self, trainer, pl_module) -> None:
        self._register(trainer)  # trainer.validate() has no fit start
        self._metrics_before_loop = dict(trainer.callback_metrics)
        driver = self._active()
        if driver is not None and driver.open is not None and driver.open[0] is ModeKeys.TRAIN \
                and driver.open[1] is not None and trainer.global_step > driver.open[1]:
            with driver.hook.guard("Lightning on_validation_start"):
                driver.end()  # an epoch's last step, kept open for its epoch-level metrics: validation comes first
        # The hook has one open step: EVAL steps begun now would end the TRAIN step whose
        # gradients are still accumulating, and the rest of it would become a second TRAIN step.
        self._validation_skipped = driver is not None and driver.open is not None \
            and driver.open[0] is ModeKeys.TRAIN
        if self._validation_skipped and not self._warned_mid_accumulation:
            assert driver is not None and driver.open is not None  # as _validation_skipped says
            self._warned_mid_accumulation = True
            logger.warning("smdebug: a validation runs in the middle of gradient accumulation (optimizer step %d, "
                           "accumulate_grad_batches=%s, val_check_interval=%s); it is not captured, so that the "
                           "TRAIN step stays whole. Validations after a completed optimizer step are captured: make "
                           "val_check_interval a multiple of accumulate_grad_batches to capture every one",
                           driver.open[1], trainer.accumulate_grad_batches, trainer.val_check_interval)

    def on_test_start(self, trainer, pl_module) -> None:
        self._register(trainer)
        self._metrics_before_loop = dict(trainer.callback_metrics)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not (trainer.sanity_checking or self._validation_skipped):
            self._begin_batch(ModeKeys.EVAL, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not (trainer.sanity_checking or self._validation_skipped):
            self._end_batch(outputs)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._validation_skipped:
            self._validation_skipped = False
        elif not trainer.sanity_checking:
            driver = self._active()
            if driver is not None and trainer.state.fn == "fit":
                with driver.hook.guard("Lightning on_validation_end"):
                    self._early_stopping.validation_end(trainer, driver.hook)  # its metrics' step, before it ends
            self._end_loop("on_validation_end", trainer.callback_metrics)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._begin_batch(ModeKeys.EVAL, "on_test_batch_start")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._end_batch(outputs)

    def on_test_end(self, trainer, pl_module) -> None:
        self._end_loop("on_test_end", trainer.callback_metrics)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._begin_batch(ModeKeys.PREDICT, "on_predict_batch_start")

    def on_predict_end(self, trainer, pl_module) -> None:
        self._end_loop("on_predict_end", None)

    def _begin_batch(self, mode: ModeKeys, where: str) -> None:
        driver = self._active()
        if driver is not None:
            with driver.hook.guard(f"Lightning {where}"):
                driver.begin(mode)

    def _end_batch(self, outputs) -> None:
        driver = self._active()
        if driver is not None and driver.open is not None:
            with driver.hook.guard("Lightning batch end"):
                driver.add_loss(loss_of(outputs))
                driver.finish(None, log_scalars=False)

    def _end_loop(self, where: str, metrics) -> None:
        """A loop ended: the metrics it logged (new value objects since it started) go into
        its last step, which ends."""
        driver = self._active()
        before, self._metrics_before_loop = self._metrics_before_loop, {}
        if driver is not None:
            with driver.hook.guard(f"Lightning {where}"):
                if metrics is not None and driver.open is not None:
                    driver.save_metrics({name: value for name, value in metrics.items() if before.get(name) is not value},
                                        only_changed=False)
                driver.end()

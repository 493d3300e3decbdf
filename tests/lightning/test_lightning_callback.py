"""DebuggerCallback in real Lightning Trainers, read back from the files it wrote."""
import json
import logging
import os

import numpy as np
import pytorch_lightning as pl
import pytest
import torch

from lightning_helpers import TinyModule, loader, trainer
from smdebug.exceptions import ConfigError
from smdebug.lightning import DebuggerCallback, SaveConfig
from smdebug.trials import create_trial

EVERY_STEP = {"save_config": SaveConfig(save_interval=1)}


def fit(tmp_path, callback_kwargs=None, module=None, val_batches=0, **trainer_kwargs):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, **{**EVERY_STEP, **(callback_kwargs or {})})
    module = module or TinyModule()
    torch.manual_seed(0)
    t = trainer([callback], **trainer_kwargs)
    t.fit(module, loader(8), loader(val_batches, seed=1) if val_batches else None)
    callback.close()
    return module, t, create_trial(out)


@pytest.mark.parametrize("module_class", ["TinyModule", "Wide"])  # read on the training thread / the worker
def test_gradient_accumulation_gives_one_step_with_the_accumulated_gradients(tmp_path, module_class):
    module, t, trial = fit(tmp_path, {"include_collections": ["weights", "biases", "gradients", "losses"]},
                           module=globals()[module_class](), accumulate_grad_batches=4)
    assert t.global_step == 2  # 8 batches, 4 per optimizer step
    assert trial.steps() == [0, 1]
    assert [trial.mode_step(s) for s in trial.steps()] == [0, 1]
    assert sorted(module.seen) == [0, 1]
    for step, params in module.seen.items():
        for name, (weight, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"{module_class}_{name}").value(step), weight.numpy())
            np.testing.assert_array_equal(trial.tensor(f"gradient/{module_class}_{name}").value(step), grad.numpy())
    # The step's loss: the mean of its 4 micro-batches' training_step losses.
    for step in (0, 1):
        np.testing.assert_allclose(trial.tensor("loss").value(step), np.mean(module.losses[4 * step:4 * step + 4]),
                                   rtol=1e-5)


def test_modes_and_steps_follow_the_trainer(tmp_path):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["weights", "gradients"],
                                include_regex=["^net.2_output_0$"], **EVERY_STEP)
    module = TinyModule()
    t = trainer([callback], max_epochs=2, num_sanity_val_steps=2)
    t.fit(module, loader(3), loader(2, seed=1))
    t.test(module, loader(2, seed=2))
    predictions = t.predict(module, loader(1, seed=3))
    callback.close()
    trial = create_trial(out)
    modes = [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()]
    # Two epochs of 3 optimizer steps each followed by 2 validation batches (no sanity-check
    # steps), then 2 test batches (EVAL) and 1 predict batch.
    assert modes == [("TRAIN", 0), ("TRAIN", 1), ("TRAIN", 2), ("EVAL", 0), ("EVAL", 1),
                     ("TRAIN", 3), ("TRAIN", 4), ("TRAIN", 5), ("EVAL", 2), ("EVAL", 3),
                     ("EVAL", 4), ("EVAL", 5), ("PREDICT", 0)]
    assert t.global_step == 6
    assert trial.tensor("gradient/TinyModule_net.0.weight").steps() == [0, 1, 2, 5, 6, 7]  # TRAIN only
    assert trial.tensor("TinyModule_net.0.weight").steps() == trial.steps()
    # module outputs through the PyTorch hook's module hooks, in every mode (the logits of each batch)
    assert trial.tensor("net.2_output_0").steps() == trial.steps()
    assert trial.tensor("net.2_output_0").value(0).shape == (4, 3)
    np.testing.assert_array_equal(trial.tensor("net.2_output_0").value(trial.steps()[-1]), predictions[0].numpy())
    # Logged metrics as scalars: the training loss at each step, val_loss after each validation.
    val = trial.tensor("scalar/val_loss")
    assert [trial.mode(s).name for s in val.steps()] == ["EVAL", "EVAL"]
    assert val.steps() == [4, 9]
    assert [trial.mode(s).name for s in trial.tensor("scalar/train_loss").steps()] == ["TRAIN"] * 6  # not in EVAL
    assert trial.tensor("scalar/train/loss").steps() == [0, 1, 2, 5, 6, 7]
    np.testing.assert_allclose(trial.tensor("scalar/train/loss").value(0), module.losses[0], rtol=1e-6)
    assert trial.tensor("scalar/test_loss").steps() == [11]


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="include_workers"):
        DebuggerCallback(out_dir=str(tmp_path / "run"), include_workers="some")
    with pytest.raises(ConfigError, match="save_intervall"):
        DebuggerCallback(out_dir=str(tmp_path / "run"), save_intervall=3)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        DebuggerCallback(json_config_path=str(tmp_path / "nope.json"))
    assert not (tmp_path / "run").exists()


class Diverging(TinyModule):
    """Its loss is NaN from optimizer step 3 on."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= 3 else loss


def test_a_rules_stop_training_stops_the_trainer(tmp_path):
    from smdebug.rules import ExplodingTensor, StopTraining

    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, **EVERY_STEP)
    module = Diverging()
    t = trainer([callback], max_epochs=1)

    class AttachRule(pl.Callback):  # the hook exists once the Trainer set up
        def setup(self, trainer, pl_module, stage):
            self.live = callback.hook.add_rule(ExplodingTensor(collection_names="losses"), actions=StopTraining())

    rule = AttachRule()
    t.callbacks.append(rule)
    t.fit(module, loader(20))
    callback.close()
    assert rule.live.violation_steps[0] == 3
    assert t.should_stop and t.global_step == 4  # stopped at the end of the step the rule fired on
    assert "ExplodingTensor" in json.load(open(os.path.join(out, "training_stop_reason.json")))["reason"]


def test_a_fault_inside_the_hook_costs_the_capture_not_the_training(tmp_path, caplog):
    from trainer_helpers import hook_with_failing_backend

    hook = hook_with_failing_backend(tmp_path / "run", **EVERY_STEP)
    module = TinyModule()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        t = trainer([DebuggerCallback(hook=hook)], max_epochs=1)
        t.fit(module, loader(6), loader(2, seed=1))
    assert t.global_step == 6 and len(module.losses) == 6  # training ran to the end
    assert not hook.enabled
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("smdebug")]
    assert len(warnings) == 1 and "injected fault" in warnings[0]


def test_an_unwritable_run_costs_the_capture_not_the_training(tmp_path, caplog):
    from smdebug.pytorch import Hook

    run = tmp_path / "run"
    hook = Hook(out_dir=str(run), include_collections=["weights", "gradients"], **EVERY_STEP)
    for folder in ("events", "store"):  # neither layout's folder can be created: every step's write fails
        (run / folder).write_text("")
    module = TinyModule()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        t = trainer([DebuggerCallback(hook=hook)], max_epochs=1)
        t.fit(module, loader(6))
        hook.close()
    assert t.global_step == 6 and not hook.enabled
    assert len([r for r in caplog.records if r.name.startswith("smdebug")]) == 1


def test_without_arguments_or_config_it_says_so_and_training_runs(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    callback = DebuggerCallback()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        t = trainer([callback])
        t.fit(TinyModule(), loader(2))
    assert t.global_step == 2 and callback.hook is None
    assert [r.getMessage() for r in caplog.records if "nothing to write to" in r.getMessage()]


class Failing(TinyModule):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("the user's bug")
        return super().training_step(batch, batch_idx)


def test_when_training_fails_the_steps_so_far_are_on_disk(tmp_path):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["gradients"], **EVERY_STEP)
    with pytest.raises(RuntimeError, match="the user's bug"):
        trainer([callback]).fit(Failing(), loader(8))
    # read while the hook is still open (no close): the failure flushed the finished steps
    assert create_trial(out).tensor("gradient/Failing_net.0.weight").steps() == [0, 1, 2]
    callback.close()


def test_a_json_config_configures_the_hook(tmp_path):
    from trainer_helpers import write_config

    out = tmp_path / "run"
    config = write_config(tmp_path / "hook.json", out, {"save_interval": "2"}, ["gradients"])
    callback = DebuggerCallback(json_config_path=config)
    trainer([callback]).fit(TinyModule(), loader(6))
    callback.close()
    assert create_trial(str(out)).tensor("gradient/TinyModule_net.0.weight").steps() == [0, 2, 4]


class Wide(TinyModule):
    """Gradients large enough (131k elements) to be read on the step pipeline's worker."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                       torch.nn.ReLU(), torch.nn.Linear(256, 3))


def test_gradients_are_those_before_lightnings_clipping(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        module, t, trial = fit(tmp_path, {"include_collections": ["gradients"]}, module=Wide(), gradient_clip_val=1e-3)
    grad = trial.tensor("gradient/Wide_net.2.weight")
    assert grad.steps() == [0, 1, 2, 3, 4, 5, 6, 7]
    for step, params in module.seen.items():  # seen before Lightning clipped them in place
        np.testing.assert_array_equal(grad.value(step), params["net.2.weight"][1].numpy())
    assert np.linalg.norm(grad.value(7)) > 1e-3  # unclipped: clipping to a norm of 1e-3 would show
    assert not [r for r in caplog.records if r.name.startswith("smdebug")]


def test_a_resumed_fit_goes_on_from_the_trainers_global_step(tmp_path):
    first = trainer([], max_steps=3)
    module = TinyModule()
    first.fit(module, loader(8))
    checkpoint = str(tmp_path / "three.ckpt")
    first.save_checkpoint(checkpoint)
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["gradients"], **EVERY_STEP)
    resumed = trainer([callback], max_steps=6, max_epochs=3)
    resumed.fit(TinyModule(), loader(8), ckpt_path=checkpoint)
    callback.close()
    trial = create_trial(out)
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [("TRAIN", 3), ("TRAIN", 4),
                                                                                  ("TRAIN", 5)]


def test_the_unified_lightning_packages_trainer_takes_the_same_callback(tmp_path):
    """``lightning.pytorch`` (``import lightning as L``) is a separate copy of Lightning whose
    Trainer accepts only its own Callback subclasses: DebuggerCallback derives from both."""
    L = pytest.importorskip("lightning.pytorch")

    class Unified(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 3)
            self.seen = {}

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def on_before_optimizer_step(self, optimizer):
            self.seen[self.trainer.global_step] = self.net.weight.grad.detach().clone()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["gradients"], **EVERY_STEP)
    assert isinstance(callback, L.Callback) and isinstance(callback, pl.Callback)
    module = Unified()
    t = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    t.fit(module, loader(3))
    callback.close()
    trial = create_trial(out)
    assert trial.steps() == [0, 1, 2] and t.global_step == 3
    for step, grad in module.seen.items():
        np.testing.assert_array_equal(trial.tensor("gradient/Unified_net.weight").value(step), grad.numpy())


def test_a_validation_in_the_middle_of_gradient_accumulation_leaves_the_train_step_whole(tmp_path, caplog):
    # Validation every 2 batches, optimizer steps every 4: every other validation runs while an
    # optimizer step is half accumulated. That TRAIN step stays one step (weights, accumulated
    # gradients, loss); the validation run inside it is not captured, and says so once.
    module, t, trial = fit(tmp_path, {"include_collections": ["weights", "biases", "gradients", "losses"]},
                           accumulate_grad_batches=4, val_batches=1, val_check_interval=2)
    assert t.global_step == 2
    train = [s for s in trial.steps() if trial.mode(s).name == "TRAIN"]
    assert [trial.mode_step(s) for s in train] == [0, 1]
    for step, params in module.seen.items():
        for name, (weight, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"TinyModule_{name}").value(train[step]), weight.numpy())
            np.testing.assert_array_equal(trial.tensor(f"gradient/TinyModule_{name}").value(train[step]),
                                          grad.numpy())
        np.testing.assert_allclose(trial.tensor("loss").value(train[step]),
                                   np.mean(module.losses[4 * step:4 * step + 4]), rtol=1e-5)
    # The validations after each complete optimizer step are captured (one batch each).
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("EVAL", 0), ("TRAIN", 1), ("EVAL", 1)]
    assert caplog.text.count("in the middle of gradient accumulation") == 1


def test_amp_gradients_are_saved_unscaled(tmp_path):
    # fp16 AMP with a real GradScaler (Lightning picks bf16 without one on CPU unless given the plugin).
    from pytorch_lightning.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    module, t, trial = fit(tmp_path, {"include_collections": ["weights", "biases", "gradients"]},
                           accumulate_grad_batches=2, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert scaler.get_scale() > 1 and trial.steps() == [0, 1, 2, 3]
    for step, params in module.seen.items():  # what the optimizer steps with: after unscale_
        for name, (weight, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/TinyModule_{name}").value(step), grad.numpy())
            np.testing.assert_array_equal(trial.tensor(f"TinyModule_{name}").value(step), weight.numpy())


class TwoOptimizers(pl.LightningModule):
    """Manual optimization with one optimizer per layer, as GANs do: Lightning counts each
    optimizer's step in ``global_step`` (2 per batch)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
        self.seen = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        first, second = self.optimizers()
        loss = torch.nn.functional.cross_entropy(self.b(torch.relu(self.a(x))), y)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        self.seen[len(self.seen)] = {n: (p.detach().clone(), p.grad.detach().clone()) for n, p in self.named_parameters()}
        first.step()
        second.step()
        return loss

    def configure_optimizers(self):
        return [torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)]


def test_two_optimizers_stepped_by_hand_give_one_step_per_batch(tmp_path):
    module, t, trial = fit(tmp_path, {"include_collections": ["weights", "biases", "gradients", "losses"]},
                           module=TwoOptimizers())
    assert t.global_step == 16  # 8 batches, two optimizer steps each
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [("TRAIN", 2 * i) for i in range(8)]
    for step, params in module.seen.items():  # both layers' weights before either optimizer stepped
        for name, (weight, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"TwoOptimizers_{name}").value(step), weight.numpy())
            np.testing.assert_array_equal(trial.tensor(f"gradient/TwoOptimizers_{name}").value(step), grad.numpy())


class EpochLogging(TinyModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


def test_epoch_level_metrics_are_saved_in_each_epochs_last_step(tmp_path):
    # Lightning reduces on_epoch=True values at the epoch's end, after its last batch.
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["losses"], save_config=SaveConfig(save_interval=1))
    t = trainer([callback], max_epochs=2, log_every_n_steps=1)
    module = EpochLogging()
    t.fit(module, loader(4))
    callback.close()
    trial = create_trial(out)
    epoch_loss = trial.tensor("scalar/epoch_loss")
    assert epoch_loss.steps() == [3, 7]  # 4 batches an epoch; not saved again at the next logging step
    np.testing.assert_allclose(epoch_loss.value(7), float(t.callback_metrics["epoch_loss"]), rtol=1e-6)

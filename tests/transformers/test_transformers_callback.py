"""DebuggerCallback in real Hugging Face Trainers, read back from the files it wrote."""
import json
import logging
import os

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from hf_helpers import Recorder, make_trainer
from smdebug.exceptions import ConfigError
from smdebug.transformers import DebuggerCallback, SaveConfig
from smdebug.trials import create_trial

EVERY_STEP = {"save_config": SaveConfig(save_interval=1)}


@pytest.mark.parametrize("hidden", [16, 128])  # gradients read on the training thread / the worker
def test_gradient_accumulation_gives_one_step_with_the_accumulated_gradients(tmp_path, hidden):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["weights", "biases", "gradients", "losses"],
                                **EVERY_STEP)
    recorder = Recorder()
    trainer = make_trainer(tmp_path, [callback, recorder], train_n=32, gradient_accumulation_steps=4, hidden=hidden)
    trainer.train()
    callback.close()
    trial = create_trial(out)
    assert trainer.state.global_step == 2  # 8 batches, 4 per optimizer step
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [("TRAIN", 0), ("TRAIN", 1)]
    assert sorted(recorder.seen) == [0, 1]
    for step, params in recorder.seen.items():
        for name, (weight, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"BertForSequenceClassification_{name}").value(step),
                                          weight.numpy())
            np.testing.assert_array_equal(trial.tensor(f"gradient/BertForSequenceClassification_{name}").value(step),
                                          grad.numpy())
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert trial.tensor("scalar/train/loss").steps() == [0, 1]
    np.testing.assert_allclose([trial.tensor("scalar/loss").value(s).item() for s in (0, 1)], logged, rtol=1e-6)
    np.testing.assert_allclose([trial.tensor("loss").value(s) for s in (0, 1)], logged, rtol=1e-5)


def test_the_loss_of_a_step_is_the_trainers_with_a_short_last_step(tmp_path):
    # 10 batches, 4 a step: the epoch's last step runs 2. The saved loss is the one the Trainer logs.
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["losses"], **EVERY_STEP)
    trainer = make_trainer(tmp_path, [callback], train_n=40, gradient_accumulation_steps=4)
    trainer.train()
    callback.close()
    trial = create_trial(out)
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == 3 and len(logged) == 3
    np.testing.assert_allclose([trial.tensor("loss").value(s) for s in trial.steps()], logged, rtol=1e-5)


def test_epoch_logs_and_the_training_summary_are_saved(tmp_path):
    # logging_strategy="epoch": the Trainer logs after each epoch's last step has ended; the
    # training's summary (train_loss, train_runtime) after the last one.
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["losses"], **EVERY_STEP)
    trainer = make_trainer(tmp_path, [callback], train_n=12, num_train_epochs=2, logging_strategy="epoch")
    trainer.train()
    callback.close()
    trial = create_trial(out)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trial.tensor("scalar/loss").steps() == [2, 5]  # each epoch's last step (3 a epoch)
    np.testing.assert_allclose([trial.tensor("scalar/loss").value(s).item() for s in (2, 5)],
                               [entry["loss"] for entry in logged], rtol=1e-6)
    summary = trainer.state.log_history[-1]
    assert trial.tensor("scalar/train_loss").steps() == [5]
    np.testing.assert_allclose(trial.tensor("scalar/train_loss").value(5), summary["train_loss"], rtol=1e-6)


def test_a_second_train_with_the_same_callback_saves_no_step_twice(tmp_path, caplog):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["losses"], **EVERY_STEP)
    trainer = make_trainer(tmp_path, [callback], train_n=12)
    trainer.train()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        trainer.train()  # starts its step count over
    callback.close()
    trial = create_trial(out)
    assert trial.steps(mode="TRAIN") == list(range(6))  # 3 and 3, numbered on
    assert len([r for r in caplog.records if "already saved" in r.getMessage()]) == 1


def test_modes_and_steps_follow_the_trainer(tmp_path):
    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, include_collections=["weights", "gradients", "losses"], **EVERY_STEP)
    trainer = make_trainer(tmp_path, [callback], train_n=12, eval_n=8, num_train_epochs=2, eval_strategy="epoch")
    trainer.train()
    trainer.evaluate()
    callback.close()
    trial = create_trial(out)
    modes = [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()]
    # 3 optimizer steps an epoch, each epoch followed by an evaluation of 2 batches; then evaluate() again.
    assert modes == [("TRAIN", 0), ("TRAIN", 1), ("TRAIN", 2), ("EVAL", 0), ("EVAL", 1),
                     ("TRAIN", 3), ("TRAIN", 4), ("TRAIN", 5), ("EVAL", 2), ("EVAL", 3), ("EVAL", 4), ("EVAL", 5)]
    assert trainer.state.global_step == 6
    assert trial.tensor("gradient/BertForSequenceClassification_classifier.weight").steps() == [0, 1, 2, 5, 6, 7]
    eval_loss = trial.tensor("scalar/eval_loss")
    assert eval_loss.steps() == [4, 9, 11]  # in each evaluation's last step
    logged = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    np.testing.assert_allclose([eval_loss.value(s).item() for s in eval_loss.steps()], logged, rtol=1e-6)
    # an EVAL step's loss is its batch's; the evaluation's eval_loss is their mean
    np.testing.assert_allclose(np.mean([trial.tensor("loss").value(s) for s in (10, 11)]), logged[-1], rtol=1e-5)


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="'sometimes'"):
        DebuggerCallback(out_dir=str(tmp_path / "run"), save_all="sometimes")
    with pytest.raises(ConfigError, match="json_config_path and hook arguments"):
        DebuggerCallback(out_dir=str(tmp_path / "run"), json_config_path=str(tmp_path / "x.json"))


class Poison(TrainerCallback):
    """Makes the loss NaN from optimizer step 3 on."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 3:
            with torch.no_grad():
                model.classifier.weight.fill_(float("nan"))


def test_a_rules_stop_training_stops_the_trainer(tmp_path):
    from smdebug.rules import ExplodingTensor, StopTraining

    out = str(tmp_path / "run")
    callback = DebuggerCallback(out_dir=out, **EVERY_STEP)
    trainer = make_trainer(tmp_path, [callback, Poison()], train_n=40)  # 10 steps unless stopped
    live = callback.hook.add_rule(ExplodingTensor(collection_names="losses"), actions=StopTraining())
    trainer.train()
    callback.close()
    assert live.violation_steps[0] == 3
    assert trainer.state.global_step == 4  # stopped after the step the rule fired on
    assert "ExplodingTensor" in json.load(open(os.path.join(out, "training_stop_reason.json")))["reason"]


def test_a_fault_inside_the_hook_costs_the_capture_not_the_training(tmp_path, caplog):
    from trainer_helpers import hook_with_failing_backend

    hook = hook_with_failing_backend(tmp_path / "run", **EVERY_STEP)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        trainer = make_trainer(tmp_path, [DebuggerCallback(hook=hook)], train_n=16, eval_n=8)
        trainer.train()
        trainer.evaluate()
    assert trainer.state.global_step == 4 and not hook.enabled
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("smdebug")]
    assert len(warnings) == 1 and "injected fault" in warnings[0]

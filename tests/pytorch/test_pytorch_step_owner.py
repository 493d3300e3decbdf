"""The step-owner contract (Hook.own_steps): an integration drives the steps of a plain loop.

What the trainer callbacks (smdebug.lightning, smdebug.transformers) rely on, checked on a
hand-written loop with gradient accumulation, where the forward passes of a step are not
what starts it.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import batches, make_model  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def test_the_owner_decides_steps_modes_and_when_parameters_are_taken(run_dir):
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.own_steps("test loop")
    seen = []
    data = batches(6)
    for step in range(2):  # 3 micro-batches per step; the forwards start no step
        hook.set_mode(smd.modes.TRAIN)
        hook.begin_step()
        for x, y in data[3 * step:3 * step + 3]:
            (loss_fn(model(x), y) / 3).backward()
        hook.capture_parameters(optimizer)
        seen.append((model.fc1.weight.detach().clone(), model.fc1.weight.grad.clone()))
        optimizer.step()
        optimizer.zero_grad()
    hook.set_mode(smd.modes.EVAL)
    hook.begin_step()
    with torch.no_grad():
        model(data[0][0])
    hook.close()
    trial = create_trial(run_dir)
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("TRAIN", 1), ("EVAL", 0)]
    for step, (weight, grad) in enumerate(seen):
        np.testing.assert_array_equal(trial.tensor("Net_fc1.weight").value(step), weight.numpy())
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step), grad.numpy())
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 1]
    assert trial.tensor("Net_fc1.weight").steps() == [0, 1, 2]


def test_a_stop_request_is_left_to_the_owner(run_dir):
    hook = smd.Hook(out_dir=run_dir)
    model = make_model()
    hook.register_module(model)
    hook.own_steps("test loop")
    hook.begin_step()
    hook.request_stop("a rule fired")
    model(batches(1)[0][0])  # no TrainingStopRequested from the forward pass: the owner stops its trainer
    assert hook.stop_requested
    hook.close()


def test_one_owner_per_hook(run_dir):
    hook = smd.Hook(out_dir=run_dir)
    hook.own_steps("Lightning")
    hook.own_steps("Lightning")  # the same integration again (a second Trainer) is fine
    with pytest.raises(ConfigError, match="already owned by Lightning"):
        hook.own_steps("Transformers")
    with pytest.raises(ConfigError, match="None"):
        smd.Hook(out_dir=run_dir + "2").own_steps(None)
    hook.close()

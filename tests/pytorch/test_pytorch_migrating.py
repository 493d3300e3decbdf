"""PyTorch scripts written against smdebug 1.0.34 run unchanged (docs/migrating.md)."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

from pt_helpers import batches, make_model  # noqa: E402


def test_record_tensor_value_saves_a_functional_loss_with_a_deprecation_warning(run_dir):
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    hook.register_hook(model)  # 1.0.34's other name for register_module
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in batches(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)  # a function, not a module
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hook.record_tensor_value("nll_loss", loss)
        assert any(issubclass(w.category, DeprecationWarning) and "save_tensor" in str(w.message) for w in caught)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="losses") == ["nll_loss_output_0"]  # 1.0.34's name
    saved = [trial.tensor("nll_loss_output_0").value(s).item() for s in trial.steps()]
    assert saved == pytest.approx(losses)


def test_record_tensor_value_refuses_non_tensors_saying_what_to_use(run_dir):
    hook = smd.Hook(out_dir=run_dir)
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="save_tensor"):
        hook.record_tensor_value("loss", 0.5)
    hook.close()


def test_del_hook_forgets_the_process_hook(run_dir):
    hook = smd.Hook(out_dir=run_dir)
    assert smd.get_hook() is hook
    smd.del_hook()
    assert smd.get_hook() is None
    hook.close()


def test_save_tensor_before_the_first_forward(run_dir):
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    model = make_model()
    hook.register_module(model)
    hook.save_tensor("class_weights", torch.tensor([0.2, 0.3, 0.5]), "custom")  # before any step
    for x, _ in batches(2):
        model(x)
    hook.close()
    trial = create_trial(run_dir)
    assert np.allclose(trial.tensor("class_weights").value(0), [0.2, 0.3, 0.5])


def test_without_set_mode_steps_are_train_or_eval_and_global_reads_still_work(run_dir):
    # docs/migrating.md: 1.0.34 records GLOBAL here; we take the mode from module.training,
    # and what 1.0.34 code reads with mode=GLOBAL still addresses every step by its global number.
    from smdebug.modes import ModeKeys

    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    model = make_model()
    hook.register_module(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in batches(3):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        for x, y in batches(2):
            losses.append(loss_fn(model(x), y).item())
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2] and trial.steps(mode=ModeKeys.EVAL) == [0, 1]
    assert trial.steps(mode=ModeKeys.GLOBAL) == [0, 1, 2, 3, 4]
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert loss.steps(mode=ModeKeys.GLOBAL) == [0, 1, 2, 3, 4]
    assert [loss.value(s, mode=ModeKeys.GLOBAL).item() for s in range(5)] == pytest.approx(losses)


def test_a_trial_opened_before_close_in_the_training_process_sees_every_ended_step(tmp_path, monkeypatch):
    # 1.0.34's own test_reduce_config_with_json reads the run before closing the hook: every
    # ended step must be there (ours finishes and writes steps off the training thread).
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_all": False, "reductions": "max, mean, variance", "save_steps": "0,1,2,3"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"}, {"CollectionName": "biases"}, {"CollectionName": "gradients"},
            {"CollectionName": "ReluActivation",
             "CollectionParameters": {"include_regex": "relu*", "save_steps": "4,5,6", "reductions": "min,abs_max"}},
        ]}))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    hook = smd.Hook.create_from_json_file()
    hook._session.writer.max_delay = 60.0  # a writer that holds ended steps long: only a flush writes them

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu0, self.fc2 = torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.fc2(self.relu0(self.fc1(x)))

    model = Net()
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.rand(16, 4)), torch.randint(0, 2, (16,))).backward()
        optimizer.step()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3, 4, 5, 6]
    relu = trial.tensor_names(regex="relu0_input_0")
    assert relu and trial.tensor(relu[0]).reduction_value(6, "max", abs=True) is not None
    hook.close()

"""The PyTorch hook with real training loops, read back with create_trial."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug  # noqa: E402
import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import Net, batches, evaluate, make_model, train, write_config  # noqa: E402
from smdebug import reductions  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

TRAIN, EVAL = smd.modes.TRAIN, smd.modes.EVAL
PARAMS = ["Net_conv.weight", "Net_conv.bias", "Net_fc1.weight", "Net_fc1.bias", "Net_fc2.weight", "Net_fc2.bias"]


def every_step(**kwargs):
    return smd.Hook(save_config=smd.SaveConfig(save_interval=1), **kwargs)


def train_recording(model, loss_fn, data, accumulate=1):
    """Train; return, per optimizer step, the parameters and gradients just before the update."""
    seen = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def before_update(opt, args, kwargs):
        seen.append({name: (p.detach().clone(), None if p.grad is None else p.grad.clone())
                     for name, p in model.named_parameters()})

    handle = optimizer.register_step_pre_hook(before_update)
    train(model, loss_fn, data, optimizer, accumulate=accumulate)
    handle.remove()
    return seen


def test_public_api_reexports_the_core_objects():
    for name in ("SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionKeys", "ModeKeys",
                 "modes"):
        assert getattr(smd, name) is getattr(smdebug, name)
    assert issubclass(smd.Hook, smdebug.Hook) and smd.Hook.register_hook is smd.Hook.register_module


def test_pytorch_profile_regexes_match_original_names():
    from smdebug.collections import CollectionManager

    mgr = CollectionManager(smd.Hook.profile)
    names = lambda t: sorted(c.name for c in mgr.collections_for(t))  # noqa: E731
    assert names("Net_fc1.weight") == ["weights"]
    assert names("gradient/Net_fc1.weight") == ["gradients"]
    assert names("Net_fc1.bias") == ["biases"]
    assert names("CrossEntropyLoss_output_0") == ["losses"]
    assert names("CrossEntropyLoss_input_0") == []


def test_default_configuration_saves_losses_every_500_steps(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    losses = []
    data = batches(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in data:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0]
    assert trial.tensor_names() == ["CrossEntropyLoss_output_0"]
    assert trial.tensor("CrossEntropyLoss_output_0").value(0) == pytest.approx(losses[0])
    assert trial.workers() == ["worker_0"]


def test_weights_biases_gradients_and_losses_hold_the_step_values(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    expected = train_recording(model, loss_fn, batches(4))
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2, 3] and trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert sorted(trial.tensor_names(collection="weights")) == sorted(n for n in PARAMS if "weight" in n)
    assert sorted(trial.tensor_names(collection="biases")) == sorted(n for n in PARAMS if "bias" in n)
    assert sorted(trial.tensor_names(collection="gradients")) == sorted(f"gradient/{n}" for n in PARAMS)
    for step, params in enumerate(expected):
        for pname, (value, grad) in params.items():
            name = f"Net_{pname}"
            np.testing.assert_array_equal(trial.tensor(name).value(step), value.numpy())
            np.testing.assert_array_equal(trial.tensor(f"gradient/{name}").value(step), grad.numpy())


def test_reductions_equal_numpy_reference(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    config = smd.ReductionConfig(reductions=["min", "max", "mean", "std", "variance", "sum", "prod"],
                                 abs_reductions=["mean", "max"], norms=["l1", "l2"], abs_norms=["l2"])
    hook = every_step(out_dir=run_dir, include_collections=["weights", "gradients", "losses"],
                      reduction_config=config)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    expected = train_recording(model, loss_fn, batches(2))
    hook.close()

    trial = create_trial(run_dir)
    keys = [(op, False) for op in config.reductions + config.norms] + \
           [(op, True) for op in config.abs_reductions + config.abs_norms]
    for step, params in enumerate(expected):
        for pname, (value, grad) in params.items():
            if "weight" not in pname:
                continue
            for name, array in ((f"Net_{pname}", value.numpy()), (f"gradient/Net_{pname}", grad.numpy())):
                tensor = trial.tensor(name)
                with pytest.raises(Exception):
                    tensor.value(step)  # only reductions were saved
                saved = tensor.reduction_values(step)
                assert set(saved) == set(keys)
                for key, want in zip(keys, reductions.reduce_many(array, keys)):
                    np.testing.assert_allclose(saved[key], want, rtol=1e-6, atol=1e-7, err_msg=f"{name} {key}")
    # Losses are always saved whole, never reduced.
    assert trial.tensor("CrossEntropyLoss_output_0").reduction_values(0) == {}
    assert trial.tensor("CrossEntropyLoss_output_0").value(0).shape == ()


class SharedLayerNet(torch.nn.Module):
    """Calls ``block`` twice per forward, and returns a tuple."""

    def __init__(self):
        super().__init__()
        self.block = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.block(torch.relu(self.block(x)))
        return self.head(h), h.sum()


def test_module_inputs_outputs_named_per_call_and_per_element(run_dir):
    torch.manual_seed(0)
    model = SharedLayerNet()
    hook = every_step(out_dir=run_dir)
    hook.get_collection("block").add_module_tensors(model.block, inputs=True, outputs=True)
    hook.get_collection("model_out").add_module_tensors(model, outputs=True)
    hook.register_module(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = model.block(x)
        second = model.block(torch.relu(first))
        head, total = model(x)
    hook.close()

    trial = create_trial(run_dir)
    # One recorded forward of the model (the direct block calls above ran outside any step).
    assert trial.steps() == [0]
    assert sorted(trial.tensor_names(collection="block")) == [
        "block_input_0", "block_input_1", "block_output_0", "block_output_1"]
    np.testing.assert_array_equal(trial.tensor("block_input_0").value(0), x.numpy())
    np.testing.assert_allclose(trial.tensor("block_output_0").value(0), first.numpy())
    np.testing.assert_allclose(trial.tensor("block_output_1").value(0), second.numpy())
    # The root is named by its class; a tuple output gives one index per element.
    assert sorted(trial.tensor_names(collection="model_out")) == ["SharedLayerNet_output_0", "SharedLayerNet_output_1"]
    np.testing.assert_allclose(trial.tensor("SharedLayerNet_output_1").value(0), total.numpy())
    assert trial.mode(0) == TRAIN  # model.training is True; no_grad() does not make it EVAL


class InPlaceNet(torch.nn.Module):
    """A Linear whose output a later in-place ReLU overwrites; from step ``late`` on, also the second one's."""

    def __init__(self, late):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU(inplace=True)
        self.fc2 = torch.nn.Linear(4, 4)
        self.late = late
        self.calls = 0

    def forward(self, x):
        h = self.fc2(self.act(self.fc1(x)))
        if self.calls >= self.late:
            h.mul_(2)  # changes fc2's output after fc2 returned it
        self.calls += 1
        return h


def test_module_outputs_are_the_values_the_module_returned_despite_later_in_place_changes(run_dir, caplog):
    torch.manual_seed(0)
    model = InPlaceNet(late=3)
    hook = every_step(out_dir=run_dir, include_regex=[r"fc\d_output_0"])
    hook.register_module(model)
    xs = [torch.randn(2, 4) for _ in range(5)]
    with caplog.at_level("WARNING", logger="smdebug"):
        with torch.no_grad():
            for x in xs:
                model(x)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2, 3, 4]
    with torch.no_grad():
        for step, x in enumerate(xs):
            before_relu = model.fc1(x)
            # fc1's output is changed by the in-place ReLU inside the same forward, at every step.
            np.testing.assert_allclose(trial.tensor("fc1_output_0").value(step), before_relu.numpy(), rtol=1e-6)
            if step != 3:
                np.testing.assert_allclose(trial.tensor("fc2_output_0").value(step),
                                           model.fc2(torch.relu(before_relu)).numpy(), rtol=1e-6)
    # fc2's output was copied late (it had never changed before) at the step where it first
    # changed: that value is gone, and is not saved rather than saved wrong; from then on it
    # is copied at once.
    assert 3 not in trial.tensor("fc2_output_0").steps()
    warnings = [r.getMessage() for r in caplog.records if "changed in place" in r.getMessage()]
    assert len(warnings) == 1 and "fc2_output_0" in warnings[0] and "step 3" in warnings[0]


def test_module_outputs_under_inference_mode(run_dir, caplog):
    """Inference tensors have no version counter: their outputs are copied at once, never deferred."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    hook = every_step(out_dir=run_dir, include_regex=[r"^\d_output_0$"])
    hook.register_module(model)
    xs = [torch.randn(3, 4) for _ in range(4)]
    with caplog.at_level("WARNING", logger="smdebug"):
        model(xs[0])  # training-mode forwards first: the outputs become known as deferrable
        model(xs[1])
        model.eval()
        with torch.inference_mode():
            model(xs[2])
            model(xs[3])
    hook.close()
    assert hook.enabled and not [r for r in caplog.records if r.levelno >= 30]
    trial = create_trial(run_dir)
    with torch.no_grad():
        for step, x in enumerate(xs):
            np.testing.assert_allclose(trial.tensor("0_output_0").value(step), model[0](x).numpy(), rtol=1e-6)
            np.testing.assert_allclose(trial.tensor("2_output_0").value(step), model(x).numpy(), rtol=1e-6)


def test_mode_follows_module_training_unless_set_mode(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(3))
    evaluate(model, loss_fn, batches(2, seed=1))
    train(model, loss_fn, batches(1, seed=2))
    hook.set_mode(smd.modes.PREDICT)  # explicit mode wins over model.training
    train(model, loss_fn, batches(2, seed=3))
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == list(range(8))
    assert [trial.mode(s) for s in trial.steps()] == [TRAIN] * 3 + [EVAL] * 2 + [TRAIN] + [smd.modes.PREDICT] * 2
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=EVAL) == [0, 1]
    assert trial.global_step(TRAIN, 3) == 5


def test_set_mode_around_train_and_eval_loops_keeps_every_train_step(run_dir):
    # smdebug 1.0.34's pattern: set_mode(TRAIN) / set_mode(EVAL) around each loop, the model
    # left in train() mode. The first TRAIN iteration after an EVAL loop is a step of its own.
    torch.manual_seed(0)
    model, loss_fn = torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = every_step(out_dir=run_dir, include_collections=["losses", "gradients"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    losses = []
    for _ in range(2):
        hook.set_mode(TRAIN)
        for _ in range(3):
            optimizer.zero_grad()
            loss = loss_fn(model(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
            loss.backward()
            optimizer.step()
            losses.append((TRAIN, loss.item()))
        hook.set_mode(EVAL)
        with torch.no_grad():
            for _ in range(2):
                losses.append((EVAL, loss_fn(model(torch.randn(3, 4)), torch.randint(0, 2, (3,))).item()))
    hook.close()

    trial = create_trial(run_dir)
    assert [trial.mode(s) for s in trial.steps()] == [mode for mode, _ in losses]
    assert trial.steps(mode=TRAIN) == list(range(6)) and trial.steps(mode=EVAL) == list(range(4))
    assert trial.tensor_names(regex="_output_1$") == []  # no step holds two losses
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert [loss.value(s).item() for s in trial.steps()] == pytest.approx([v for _, v in losses], rel=1e-6)
    assert trial.tensor("gradient/Linear_weight").steps(mode=TRAIN) == list(range(6))


def test_json_config_and_get_hook(tmp_path, monkeypatch):
    out = tmp_path / "run"
    config = write_config(tmp_path / "config.json", out, {"save_interval": "2", "reductions": "max,l2_norm"},
                          ["weights", ("custom", {"include_regex": "fc2_output", "save_interval": "1"})])
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", config)
    assert smd.get_hook() is None  # no hook yet, and none is created unless asked
    hook = smd.get_hook(create_if_not_exists=True)
    assert isinstance(hook, smd.Hook) and hook.out_dir == str(out)
    assert smd.get_hook() is hook
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(3))
    hook.close()

    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("fc2_output_0").steps() == [0, 1, 2]
    assert trial.tensor("Net_fc1.weight").steps() == [0, 2]
    assert set(trial.tensor("Net_fc1.weight").reduction_values(2)) == {("max", False), ("l2", False)}
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == [0, 2]


def test_gradient_accumulation_with_a_registered_optimizer(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook.register_optimizer(optimizer)
    seen = []
    optimizer.register_step_pre_hook(lambda opt, a, k: seen.append(
        {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}))
    train(model, loss_fn, batches(6), optimizer, accumulate=3)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1]  # 6 micro-batches, 2 optimizer steps
    for step in (0, 1):
        for pname, (value, grad) in seen[step].items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/Net_{pname}").value(step), grad.numpy())
            np.testing.assert_array_equal(trial.tensor(f"Net_{pname}").value(step), value.numpy())
        # Three loss calls in one step: three outputs, none overwritten.
        assert [trial.tensor(f"CrossEntropyLoss_output_{i}").value(step).shape for i in range(3)] == [()] * 3


def test_optimizer_is_recognised_at_its_first_step(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, include_collections=["gradients"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    expected = train_recording(model, loss_fn, batches(8), accumulate=2)
    hook.close()
    assert hook.step_by_optimizer
    trial = create_trial(run_dir)
    # Until the first optimizer.step() each forward is a step (0 and 1); then one step per update.
    assert trial.steps() == [0, 1, 2, 3, 4]
    for step, params in zip([1, 2, 3, 4], expected):
        for pname, (_, grad) in params.items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/Net_{pname}").value(step), grad.numpy())


def test_without_optimizer_gradients_come_from_accumulate_grad_hooks(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, include_collections=["gradients", "weights"])
    hook.register_module(model)
    grads, weights = [], []
    for x, y in batches(3):
        model.zero_grad()
        weights.append(model.fc1.weight.detach().clone())
        loss_fn(model(x), y).backward()
        grads.append(model.fc1.weight.grad.clone())
        with torch.no_grad():  # a hand-written update, no optimizer
            for p in model.parameters():
                p -= 0.1 * p.grad
    hook.close()
    assert not hook.step_by_optimizer
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    for step in range(3):
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step), grads[step].numpy())
        np.testing.assert_array_equal(trial.tensor("Net_fc1.weight").value(step), weights[step].numpy())


def test_frozen_parameters_have_no_gradients(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    model.conv.requires_grad_(False)
    hook = every_step(out_dir=run_dir, include_collections=["weights", "gradients"])
    hook.register_module(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    train(model, loss_fn, batches(2), optimizer)
    # And without an optimizer (tensor hooks are not put on frozen parameters).
    model2 = make_model()
    model2.fc2.requires_grad_(False)
    hook2 = every_step(out_dir=run_dir + "2", include_collections=["gradients"])
    hook2.register_module(model2)
    for x, y in batches(2):
        loss_fn(model2(x), y).backward()
    hook.close()
    hook2.close()
    names = create_trial(run_dir).tensor_names()
    assert "Net_conv.weight" in names and "gradient/Net_conv.weight" not in names
    assert "gradient/Net_fc1.weight" in names
    names2 = create_trial(run_dir + "2").tensor_names()
    assert "gradient/Net_fc2.weight" not in names2 and "gradient/Net_fc1.weight" in names2


def test_wrappers_do_not_change_names(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    wrapped = torch.nn.DataParallel(model)  # without GPUs it calls the module directly
    hook = every_step(out_dir=run_dir, include_collections=["weights"])
    hook.get_collection("outputs").add_module_tensors(model.fc2)
    hook.register_module(wrapped)
    train(wrapped, loss_fn, batches(2))
    hook.close()
    names = create_trial(run_dir).tensor_names()
    assert "Net_fc1.weight" in names and "fc2_output_0" in names
    assert not any("module." in n or "DataParallel" in n for n in names)


def test_save_all_and_include_regex(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, save_all=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(1))
    hook.close()
    names = set(create_trial(run_dir).tensor_names())
    expected = {*PARAMS, *(f"gradient/{n}" for n in PARAMS), "Net_input_0", "Net_output_0",
                "CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0",
                "conv_input_0", "conv_output_0", "relu_input_0", "relu_output_0", "relu_input_1", "relu_output_1",
                "fc1_input_0", "fc1_output_0", "fc2_input_0", "fc2_output_0",
                *(f"update/{n}" for n in PARAMS)}  # "all" includes every collection, updates too
    assert names == expected

    hook = every_step(out_dir=run_dir + "_regex", include_regex=[r"relu_output_\d", "fc2.bias"])
    model = make_model()
    hook.register_module(model)
    train(model, loss_fn, batches(1))
    hook.close()
    assert sorted(create_trial(run_dir + "_regex").tensor_names()) == [
        "Net_fc2.bias", "gradient/Net_fc2.bias", "relu_output_0", "relu_output_1"]


def test_save_scalar_and_save_tensor(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=2))
    hook.register_module(model)

    def after_step(i):
        hook.save_scalar("lr", 0.05 * (i + 1))
        hook.save_tensor("my_tensor", torch.full((2,), float(i)), "custom")

    train(model, loss_fn, batches(4), after_step=after_step)
    hook.close()
    trial = create_trial(run_dir)
    # A scalar is saved at every step, in the step during which it was given.
    assert trial.tensor("scalar/lr").values() == pytest.approx({0: 0.05, 1: 0.1, 2: 0.15, 3: 0.2})
    assert trial.tensor("my_tensor").steps() == [0, 2]
    assert trial.tensor("my_tensor").value(2).tolist() == [2.0, 2.0]


def test_bfloat16_model_is_saved_exactly(run_dir):
    model = make_model().to(torch.bfloat16)
    hook = every_step(out_dir=run_dir, include_collections=["weights"],
                      reduction_config=smd.ReductionConfig(norms=["l2"], save_raw_tensor=True))
    hook.register_module(model)
    with torch.no_grad():
        model(torch.randn(2, 1, 6, 6, dtype=torch.bfloat16))
    hook.close()
    tensor = create_trial(run_dir).tensor("Net_fc1.weight")
    exact = model.fc1.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(tensor.value(0), dtype=np.float32), exact)
    assert float(tensor.reduction_value(0, "l2")) == pytest.approx(float(np.linalg.norm(exact)), rel=1e-6)


def test_steps_that_save_nothing_touch_no_tensor(run_dir, monkeypatch):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_steps=[0], end_step=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.get_collection("fc1").add_module_tensors(model.fc1, inputs=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(1))
    assert hook.global_step == 0
    assert model.fc1._forward_hooks  # installed for the saved step 0
    hook.end_step()  # write step 0 now (else the next step's start does it)
    hook.flush()  # ... and wait for it: the step pipeline finishes steps on its own thread

    def touched(*args, **kwargs):
        raise AssertionError("a tensor was touched on a step that saves nothing")

    for method in ("snapshot", "capture", "materialize", "start_batch", "finish_batch"):
        monkeypatch.setattr(hook.session.backend, method, touched)
    train(model, loss_fn, batches(3))
    assert hook.global_step == 3 and hook.enabled
    assert not model.fc1._forward_hooks and not model.fc1.weight._post_accumulate_grad_hooks
    monkeypatch.undo()
    hook.close()
    assert create_trial(run_dir).steps() == [0]


def test_close_removes_every_torch_hook(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, save_all=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(1))
    hook.close()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in [*model.modules(), loss_fn])
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())
    train(model, loss_fn, batches(1))  # still trains
    assert create_trial(run_dir).steps() == [0]


def test_dry_run_writes_nothing(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, dry_run=True, save_all=True)
    hook.register_module(model)
    train(model, loss_fn, batches(2))
    hook.close()
    assert hook.global_step == 1 and not os.path.exists(run_dir)


def test_bad_arguments_fail_fast(run_dir):
    hook = smd.Hook(out_dir=run_dir, dry_run=True)
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        hook.register_module("model")
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        hook.register_loss(lambda a, b: a)
    with pytest.raises(ConfigError, match="Optimizer"):
        hook.register_optimizer(Net())
    hook.close()


def test_request_stop_ends_training_at_the_next_step(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    ran = []

    def after_step(i):
        ran.append(i)
        if i == 1:
            hook.request_stop("a rule fired")

    with pytest.raises(smd.TrainingStopRequested, match="a rule fired"):
        train(model, loss_fn, batches(5), after_step=after_step)
    assert ran == [0, 1]
    hook.close()
    assert create_trial(run_dir).steps() == [0, 1]


class Criterion(torch.nn.Module):
    """A loss module whose class name does not say "loss"."""

    def forward(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)


def test_any_registered_loss_module_is_in_losses(run_dir):
    model, loss_fn = make_model(), Criterion()
    hook = smd.Hook(out_dir=run_dir)  # default configuration: losses only
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(1))
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="losses") == ["Criterion_output_0"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model(run_dir):
    model, loss_fn = make_model().cuda(), torch.nn.CrossEntropyLoss()
    hook = every_step(out_dir=run_dir, include_collections=["weights", "gradients", "losses"],
                      reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    expected = train_recording(model, loss_fn, [(x.cuda(), y.cuda()) for x, y in batches(3)])
    hook.close()
    trial = create_trial(run_dir)
    for step, params in enumerate(expected):
        value, grad = params["fc1.weight"]
        np.testing.assert_array_equal(trial.tensor("Net_fc1.weight").value(step), value.cpu().numpy())
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step), grad.cpu().numpy())
        assert float(trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2")) == pytest.approx(
            float(np.linalg.norm(grad.cpu().numpy().ravel())), rel=1e-5)


def test_importing_the_adapter_costs_no_sharding_or_compiler_modules():
    """``import smdebug.pytorch`` must not pull in DTensor (and through it sympy and the
    symbolic-shape machinery, 0.6 s on the CI machine): sharded tensors are recognised by
    class name and their helpers imported when one is met."""
    code = ("import sys, smdebug.pytorch; "
            "print(sorted(m for m in ('torch.distributed.tensor', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_hook_with_no_registered_module_says_it_saved_nothing(run_dir, smdebug_warnings):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir)  # register_module forgotten
    train(model, loss_fn, batches(2))
    hook.close()
    warned = [m for m in smdebug_warnings(messages=True) if "saved nothing" in m]
    assert len(warned) == 1 and "hook.register_module(model)" in warned[0]

    registered = smd.Hook(out_dir=os.path.join(run_dir, "registered"))
    registered.register_module(model)
    train(model, loss_fn, batches(2))
    registered.close()
    assert len([m for m in smdebug_warnings(messages=True) if "saved nothing" in m]) == 1

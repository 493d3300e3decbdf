"""Tensors handed to the step pipeline are read before anything can change them (fences).

Each test runs with batches finished on the pipeline's worker thread and with batches
finished at hand-over (``WORKER_MIN_NUMEL``), and compares what was saved with reference
values taken by the test itself at the moment the hook's documentation promises.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
import smdebug.pytorch.backend as torch_backend  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


@pytest.fixture(params=["worker", "training thread"])
def placement(request, monkeypatch):
    monkeypatch.setattr(torch_backend, "WORKER_MIN_NUMEL", 0 if request.param == "worker" else float("inf"))
    return request.param


def make(run_dir, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients"], **kwargs)
    hook.register_module(model)
    return hook, model


def data(step):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(4, 6, generator=gen), torch.randn(4, 2, generator=gen)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_saved_weights_and_gradients_are_those_before_the_update(run_dir, placement, set_to_none):
    hook, model = make(run_dir)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    expected = []
    for step in range(4):
        x, y = data(step)
        optimizer.zero_grad(set_to_none=set_to_none)  # False: zeroes last step's gradients in place
        torch.nn.functional.mse_loss(model(x), y).backward()
        expected.append((model[0].weight.detach().clone(), model[0].weight.grad.clone()))
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir, wait_timeout=1)
    assert trial.steps() == [0, 1, 2, 3]
    for step, (weight, grad) in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(step), weight.numpy())
        np.testing.assert_array_equal(trial.tensor("gradient/Sequential_0.weight").value(step), grad.numpy())


def test_weights_changed_in_place_before_the_update_are_saved_as_the_update_sees_them(run_dir, placement):
    hook, model = make(run_dir)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_optimizer(optimizer)  # known from the first step: weights are saved just before step()
    expected = []
    for step in range(3):
        x, y = data(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():  # e.g. a weight constraint applied after backward
            model[0].weight.clamp_(-0.1, 0.1)
        expected.append(model[0].weight.detach().clone())
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir, wait_timeout=1)
    for step, weight in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(step), weight.numpy())


def test_gradients_accumulated_across_steps_without_zeroing_keep_each_steps_values(run_dir, placement):
    hook, model = make(run_dir)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook.register_optimizer(optimizer)
    expected = []
    for step in range(3):  # never zeroed: each backward adds into the .grad handed over before
        x, y = data(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        expected.append(model[2].weight.grad.clone())
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir, wait_timeout=1)
    for step, grad in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("gradient/Sequential_2.weight").value(step), grad.numpy())


def test_weights_updated_by_hand_after_the_forward_are_saved_as_the_forward_used_them(run_dir, placement):
    hook, model = make(run_dir)  # no optimizer: manual SGD
    expected = []
    for step in range(3):
        x, y = data(step)
        model.zero_grad()
        expected.append(model[0].bias.detach().clone())
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    hook.close()
    trial = create_trial(run_dir, wait_timeout=1)
    for step, bias in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("Sequential_0.bias").value(step), bias.numpy())


def test_reductions_on_the_worker_equal_the_values_saved_raw(run_dir, placement):
    hook, model = make(run_dir)
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std"], norms=["l2"], save_raw_tensor=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(3):
        x, y = data(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir, wait_timeout=1)
    tensor = trial.tensor("gradient/Sequential_0.weight")
    for step in trial.steps():
        raw = tensor.value(step).astype(np.float64)
        for name, want in (("min", raw.min()), ("max", raw.max()), ("mean", raw.mean()), ("std", raw.std()),
                           ("l2", np.sqrt((raw ** 2).sum()))):
            assert tensor.reduction_value(step, name) == pytest.approx(want, rel=1e-9, abs=1e-12), (step, name)

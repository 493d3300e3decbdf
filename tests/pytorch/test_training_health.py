"""The ``updates`` and ``optimizer_variables`` collections of the PyTorch hook, on real training,
against independent computations: an update's l2 against the norm of the difference of the
full weights saved around the step; optimizer state against ``optimizer.state`` after it."""
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import Net, batches, make_model  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

STEPS = 7


def _loop(model, optimizer, data, after_step=None):
    loss_fn = torch.nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(data):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if after_step is not None:
            after_step(i)


def _hook(out_dir, save_interval=1, **collections):
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=save_interval),
                    include_collections=list(collections))
    for name, config in collections.items():
        if config is not None:
            hook.get_collection(name).reduction_config = config
    return hook


@pytest.mark.parametrize("save_interval", [1, 3])
def test_update_l2_equals_the_norm_of_the_difference_of_weights_saved_around_the_step(tmp_path, save_interval):
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hook = _hook(tmp_path / "run", save_interval,
                 updates=smd.ReductionConfig(norms=["l2"], reductions=["max", "zero_fraction"]))
    hook.register_module(model)
    weights = []  # full weights before every step, independently of the hook
    data = batches(STEPS)

    def before(module, args):
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})

    model.register_forward_pre_hook(before)
    _loop(model, optimizer, data)
    weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    names = [f"update/Net_{n}" for n, _ in model.named_parameters()]
    assert sorted(trial.tensor_names(collection="updates")) == sorted(names)
    assert not any(n.startswith("update/") for n in trial.tensor_names(collection="weights"))
    saved_steps = list(range(0, STEPS, save_interval))
    for n, _ in model.named_parameters():
        tensor = trial.tensor(f"update/Net_{n}")
        assert tensor.steps() == saved_steps
        for step in saved_steps:
            diff = (weights[step + 1][n].double() - weights[step][n].double()).numpy()
            assert tensor.reduction_value(step, "l2", abs=False) == pytest.approx(np.linalg.norm(diff), rel=1e-6)
            assert tensor.reduction_value(step, "max", abs=False) == pytest.approx(diff.max(), rel=1e-6)


def test_full_updates_and_full_weights_saved_around_the_step(tmp_path):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = _hook(tmp_path / "run", 1, updates=None, weights=None, biases=None)
    hook.register_module(model)
    _loop(model, optimizer, batches(4))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    for name in ("Net_fc1.weight", "Net_conv.bias"):
        for step in range(3):  # weights are saved before each step: step s+1's are those after step s
            np.testing.assert_allclose(trial.tensor(f"update/{name}").value(step),
                                       trial.tensor(name).value(step + 1) - trial.tensor(name).value(step),
                                       rtol=0, atol=1e-7)


@pytest.mark.parametrize("kind", ["adam", "adamw_foreach", "adam_fused", "sgd_momentum", "rmsprop"])
def test_optimizer_state_equals_optimizer_state_after_the_step(tmp_path, kind):
    model = make_model()
    params = model.parameters()
    optimizer = {
        "adam": lambda: torch.optim.Adam(params, lr=0.01, foreach=False),
        "adamw_foreach": lambda: torch.optim.AdamW(params, lr=0.01, foreach=True),
        "adam_fused": lambda: torch.optim.Adam(params, lr=0.01, fused=True),
        "sgd_momentum": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=0.01),
    }[kind]()
    hook = _hook(tmp_path / "run", 2, optimizer_variables=None)
    hook.register_module(model)
    expected = {}

    def after_step(i):
        expected[i] = {f"optimizer/Net_{n}/{key}": value.detach().clone().numpy()
                       for n, p in model.named_parameters() for key, value in optimizer.state[p].items()
                       if isinstance(value, torch.Tensor)}

    _loop(model, optimizer, batches(5), after_step)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    keys = {"adam": {"exp_avg", "exp_avg_sq", "step"}, "adamw_foreach": {"exp_avg", "exp_avg_sq", "step"},
            "adam_fused": {"exp_avg", "exp_avg_sq", "step"}, "sgd_momentum": {"momentum_buffer"},
            "rmsprop": {"square_avg", "step"}}[kind]
    assert {n.rsplit("/", 1)[1] for n in trial.tensor_names(collection="optimizer_variables")} == keys
    assert "optimizer/Net_fc1.weight/" + sorted(keys)[0] in trial.tensor_names()
    assert not any(n.startswith("optimizer/") for n in trial.tensor_names(collection="weights"))
    for step in (0, 2, 4):
        assert set(expected[step]) == {n for n in trial.tensor_names() if n.startswith("optimizer/")}
        for name, value in expected[step].items():
            np.testing.assert_array_equal(trial.tensor(name).value(step), value, err_msg=f"{name} at {step}")
    assert trial.tensor("optimizer/Net_fc1.weight/" + sorted(keys)[0]).steps() == [0, 2, 4]


def test_bfloat16_updates_are_exact_differences(tmp_path):
    model = make_model().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = _hook(tmp_path / "run", 1, updates=None, weights=None)
    hook.register_module(model)
    data = [(x.to(torch.bfloat16), y) for x, y in batches(3)]
    _loop(model, optimizer, data)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    for step in range(2):
        after = trial.tensor("Net_fc1.weight").value(step + 1).astype(np.float64)
        before = trial.tensor("Net_fc1.weight").value(step).astype(np.float64)
        np.testing.assert_array_equal(trial.tensor("update/Net_fc1.weight").value(step), after - before)


def test_a_failing_update_warns_once_and_the_rest_is_saved(tmp_path, caplog, monkeypatch):
    from smdebug.pytorch import optimizer_capture

    def broken(param):
        raise RuntimeError("no memory for the copy")

    monkeypatch.setattr(optimizer_capture, "copy_before", broken)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hook = _hook(tmp_path / "run", 1, updates=None, optimizer_variables=None, weights=None)
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        _loop(model, optimizer, batches(3))
        hook.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "updates" in warnings[0] and "no memory" in warnings[0], warnings
    trial = create_trial(str(tmp_path / "run"))
    assert not trial.tensor_names(collection="updates")
    assert trial.tensor("optimizer/Net_fc1.weight/exp_avg").steps() == [0, 1, 2]
    assert trial.tensor("Net_fc1.weight").steps() == [0, 1, 2]


def test_updates_are_train_only_and_not_saved_by_default(tmp_path):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    _loop(model, optimizer, batches(2))
    hook.close()
    names = create_trial(str(tmp_path / "run")).tensor_names()
    assert not any(n.startswith(("update/", "optimizer/")) for n in names)
    assert Net  # the helpers' model class names the tensors


def test_optimizer_variables_exists_once_asked_for(tmp_path):
    """Not in a PyTorch run's collections file unless asked for (readers tell TensorFlow runs by
    that collection); asked for by name or from a JSON config, it has its regex."""
    hook = smd.Hook(out_dir=str(tmp_path / "a"))
    assert "optimizer_variables" not in hook.get_collections() and "updates" in hook.get_collections()
    hook.close()
    hook = smd.Hook(out_dir=str(tmp_path / "b"), include_collections=["optimizer_variables"])
    assert list(hook.get_collection("optimizer_variables").include_regex) == ["^optimizer/"]
    hook.close()


def test_trial_and_report_give_each_layers_update_to_weight_ratio(tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from smdebug.analysis.report import write_report

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    weights = []  # full weights before every step, independently of the hook

    def before(module, args):
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})

    # Updates as reductions, weights saved whole every other step: the ratio wherever both are known.
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["updates", "weights", "biases"])
    hook.get_collection("updates").reduction_config = smd.ReductionConfig(norms=["l2"])
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=2)
    hook.get_collection("biases").save_config = smd.SaveConfig(save_interval=2)
    hook.register_module(model)
    model.register_forward_pre_hook(before)
    _loop(model, optimizer, batches(STEPS))
    weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    ratios = trial.update_ratios()
    assert set(ratios["reduction"]) == {"update_ratio"}
    assert sorted(set(ratios["tensor"])) == sorted(f"Net_{n}" for n, _ in model.named_parameters())
    assert sorted(set(ratios["step"])) == [0, 2, 4, 6]
    for row in ratios.itertuples():
        n = row.tensor[len("Net_"):]
        before_step, after_step = weights[row.step][n].double(), weights[row.step + 1][n].double()
        expected = float(torch.linalg.vector_norm(after_step - before_step) / torch.linalg.vector_norm(before_step))
        assert row.value == pytest.approx(expected, rel=1e-5)
    out = tmp_path / "report.html"
    write_report(trial, str(out), rules=False)
    assert "<h3>update_ratio</h3>" in out.read_text()

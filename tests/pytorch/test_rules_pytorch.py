"""Built-in rules on real PyTorch runs, and live rules stopping PyTorch training."""
import json

import pytest

torch = pytest.importorskip("torch")
smd = pytest.importorskip("smdebug.pytorch")

from smdebug.rules import ExplodingTensor, StopTraining, VanishingGradient, invoke_rule  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

WIDTH = 16


def mlp(depth, activation):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(WIDTH, WIDTH), activation()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))


def hooked(out_dir, model, loss_fn, **kwargs):
    kwargs.setdefault("save_config", smd.SaveConfig(save_interval=1))
    hook = smd.Hook(out_dir=str(out_dir), **kwargs)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    return hook


def train(model, loss_fn, lr, steps, hook=None):
    """Plain training loop; returns the steps whose optimizer step ran and the exception that ended it, if any."""
    torch.manual_seed(1)
    x, y = torch.randn(64, WIDTH), torch.randn(64, 1) * 10
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    done, stopped_by = [], None
    for step in range(steps):
        try:
            out = model(x)
        except smd.TrainingStopRequested as exc:  # the adapter ends training at a step boundary
            stopped_by = exc
            break
        loss = loss_fn(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done.append(step)
    if hook is not None:
        hook.close()
    return done, stopped_by


@pytest.mark.parametrize("reduction_config", [smd.ReductionConfig(abs_reductions=["mean"]),
                                              smd.ReductionConfig(save_raw_tensor=True)], ids=["reductions", "raw"])
def test_vanishing_gradient_in_a_deep_sigmoid_stack(tmp_path, reduction_config):
    loss_fn = torch.nn.MSELoss()
    deep = mlp(12, torch.nn.Sigmoid)
    train(deep, loss_fn, 0.01, 3, hooked(tmp_path / "sigmoid", deep, loss_fn, include_collections=["gradients"],
                                         reduction_config=reduction_config))
    report = invoke_rule(VanishingGradient(create_trial(str(tmp_path / "sigmoid"))), report_path=None)
    assert report.violation_steps == [0, 1, 2]
    assert "gradient/Sequential_0.weight" in report.to_dict()["violations"][0]["details"]["tensors"]

    shallow = mlp(3, torch.nn.ReLU)
    train(shallow, loss_fn, 0.01, 3, hooked(tmp_path / "relu", shallow, loss_fn, include_collections=["gradients"],
                                            reduction_config=reduction_config))
    assert invoke_rule(VanishingGradient(create_trial(str(tmp_path / "relu"))), report_path=None).triggered == 0


def test_exploding_tensor_with_a_diverging_learning_rate(tmp_path):
    loss_fn = torch.nn.MSELoss()
    rc = smd.ReductionConfig(reductions=["min", "max"])
    model = mlp(2, torch.nn.ReLU)
    train(model, loss_fn, 5.0, 30, hooked(tmp_path / "diverge", model, loss_fn,
                                          include_collections=["weights", "gradients"], reduction_config=rc))
    trial = create_trial(str(tmp_path / "diverge"))
    report = invoke_rule(ExplodingTensor(trial), report_path=None)
    assert report.triggered > 0 and report.violation_steps[-1] == trial.steps()[-1]

    model = mlp(2, torch.nn.ReLU)
    train(model, loss_fn, 1e-3, 30, hooked(tmp_path / "stable", model, loss_fn,
                                           include_collections=["weights", "gradients"], reduction_config=rc))
    assert invoke_rule(ExplodingTensor(create_trial(str(tmp_path / "stable"))), report_path=None).triggered == 0


def test_live_rule_sees_what_the_offline_rule_sees(tmp_path):
    loss_fn = torch.nn.MSELoss()
    model = mlp(12, torch.nn.Sigmoid)
    hook = hooked(tmp_path / "run", model, loss_fn, include_collections=["gradients"],
                  reduction_config=smd.ReductionConfig(abs_reductions=["mean"]))
    live = hook.add_rule(VanishingGradient())
    train(model, loss_fn, 0.01, 5, hook)
    live.close()
    offline = invoke_rule(VanishingGradient(create_trial(str(tmp_path / "run"))), report_path=None)
    assert live.violation_steps == offline.violation_steps == [0, 1, 2, 3, 4]
    assert live.report.to_dict()["violations"][0]["details"] == offline.to_dict()["violations"][0]["details"]


def test_live_stop_training_ends_pytorch_training_within_one_step(tmp_path):
    loss_fn = torch.nn.MSELoss()
    model = mlp(2, torch.nn.ReLU)
    hook = hooked(tmp_path / "run", model, loss_fn)  # losses are saved by default
    live = hook.add_rule(ExplodingTensor(collection_names="losses"), actions=StopTraining())
    done, stopped_by = train(model, loss_fn, 5.0, 60, hook)
    assert live.triggered, "the loss never exploded: the test needs a diverging run"
    trigger = live.violation_steps[0]
    reason = json.load(open(tmp_path / "run" / "training_stop_reason.json"))["reason"]
    assert reason.startswith("ExplodingTensor fired at step")
    assert stopped_by is not None, f"all {len(done)} steps ran although the rule fired at step {trigger}"
    assert "ExplodingTensor fired at step" in str(stopped_by)
    assert trigger <= done[-1] <= trigger + 1  # the next forward after the rule fired raised


def test_cli_default_rules_for_a_pytorch_run(tmp_path, capsys):
    from smdebug.analysis.rules.cli import main as cli_main

    model, loss_fn = mlp(2, torch.nn.ReLU), torch.nn.MSELoss()
    hook = hooked(tmp_path / "run", model, loss_fn, include_collections=["weights", "gradients", "relu_outputs"])
    for module in model:
        if isinstance(module, torch.nn.ReLU):
            hook.get_collection("relu_outputs").add(module)
    train(model, loss_fn, 0.01, 4, hook)
    hook.close()
    assert cli_main([str(tmp_path / "run"), "--no-progress"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("PyTorch run, collections with saved tensors: ")
    assert "  skipped TreeDepth: reads XGBoost trees/feature importance; this is a PyTorch run" in out
    assert "  skipped ClassImbalance: no labels tensor saved" in out
    ran = [line.split()[0] for line in out.splitlines() if not line.startswith(("  ", "PyTorch"))]
    assert ran[:3] == ["VanishingGradient", "ExplodingTensor", "LossNotDecreasing"]
    assert "WeightUpdateRatio" in ran and "TreeDepth" not in ran

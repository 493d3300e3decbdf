"""The overhead budget (smdebug_core/capture/budget.py, adapters/pytorch/budget_capture.py):
sampled intervals, the per-step non-finite check, the ranks' agreement, bad settings.

No test asserts a time: the budget is set where any measured cost is over it (1e-6) or
where the decision follows from the costs each rank reports, whatever they are."""
import json
import re
import os
import random
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from smdebug.capture.budget import BUDGET_ENV, DECISION_PERIOD, BudgetSetting, OverheadBudget  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _train(hook, steps, nan_step=None, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(torch.randn(4, 8)), torch.randn(4, 1))
        loss.backward()
        if step == nan_step:
            with torch.no_grad():
                model[2].weight.grad[0, 0] = float("nan")  # appears in module "2"'s gradient at this step only
        optimizer.step()
    hook.close()


def test_budget_samples_gradients_every_8th_step_and_a_nan_between_is_caught_at_its_step(tmp_path):
    nan_step = random.Random().randrange(DECISION_PERIOD + 2, 3 * DECISION_PERIOD)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"],
                    reduction_config=smd.ReductionConfig(reductions=["mean", "max"]),
                    flight_recorder=smd.FlightRecorder(steps=4),
                    overhead_budget={"fraction": 1e-6, "max_factor": 8})
    _train(hook, 3 * DECISION_PERIOD + 5, nan_step)
    assert [d.level for d in hook.session.budget.history] == [3, 3, 3]

    trial = create_trial(str(tmp_path / "run"))
    grads = trial.tensor("gradient/Sequential_2.weight").steps()
    assert grads[:DECISION_PERIOD] == list(range(DECISION_PERIOD))  # before the first decision: every step
    assert all(s % 8 == 0 for s in grads[DECISION_PERIOD:]), grads  # then every 8th
    assert trial.tensor("MSELoss_output_0").steps() == list(range(3 * DECISION_PERIOD + 5))  # cheap: every step
    marker = trial.flight_recorder_trigger()
    assert marker["trigger"] == "nonfinite" and marker["global_step"] == nan_step, (nan_step, marker)
    assert marker["first_nonfinite"]["module"] == "2", marker
    assert marker["nonfinite_tensors"][0] == "gradient/Sequential_2.weight"
    assert f"at step {nan_step}" in marker["reason"]

    report = trial.overhead_budget()
    assert report["budget"] == 1e-6
    assert report["intervals"]["gradients"] == [(DECISION_PERIOD, 8)]
    assert "gradients: every 8 steps from step 20" in report["text"]


class _Net(torch.nn.Module):
    def __init__(self, unused_layer: bool):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.unused = torch.nn.Linear(1, 1) if unused_layer else None  # never called: no gradient

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("unused_layer", [False, True], ids=["every-gradient", "a-gradient-missing"])
def test_a_minus_infinity_in_a_bias_is_caught_at_its_step(tmp_path, unused_layer):
    """The CPU check sums weights stacked by shape (and falls back to one concatenation when a
    parameter has no gradient): a -inf put into a bias between backward and the update is
    caught at that step, named as the weight it is."""
    torch.manual_seed(0)
    model = _Net(unused_layer)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "losses"], flight_recorder=smd.FlightRecorder(steps=4),
                    overhead_budget={"fraction": 1e-6, "max_factor": 8})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    bad_step = DECISION_PERIOD + 3
    for step in range(bad_step + 3):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        if step == bad_step:
            with torch.no_grad():
                model.body[0].bias[3] = float("-inf")
        optimizer.step()
    hook.close()
    marker = create_trial(str(tmp_path / "run")).flight_recorder_trigger()
    assert marker["trigger"] == "nonfinite" and marker["global_step"] == bad_step, marker
    assert any(name.endswith("body.0.bias") for name in marker["nonfinite_tensors"]), marker


def test_without_a_budget_the_save_config_is_exact(tmp_path, monkeypatch):
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=3),
                    include_collections=["weights", "gradients"],
                    reduction_config=smd.ReductionConfig(reductions=["mean"]))
    assert hook.session.budget is None
    _train(hook, 2 * DECISION_PERIOD + 3)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("gradient/Sequential_0.weight").steps() == list(range(0, 2 * DECISION_PERIOD + 3, 3))
    assert trial.overhead_budget() is None
    assert not any(n.startswith("scalar/overhead_budget") for n in trial.tensor_names())


def test_the_budget_comes_from_the_environment_and_the_json_config(tmp_path, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    hook = smd.Hook(out_dir=str(tmp_path / "env"))
    assert hook.session.budget.setting.fraction == 0.05
    hook.session.close()
    monkeypatch.delenv(BUDGET_ENV)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "json"), "HookParameters": {"overhead_budget": "0.02"}}))
    hook = smd.Hook.create_from_json_file(str(config))
    assert hook.session.budget.setting == BudgetSetting(0.02)
    hook.session.close()


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.01, float("nan"), float("inf"), "two percent", True, [0.02]])
def test_a_budget_that_is_not_a_number_in_0_1_fails_at_construction(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"overhead_budget must be a number in \(0, 1\).*got " + re.escape(repr(bad))):
        smd.Hook(out_dir=str(tmp_path / "run"), overhead_budget=bad)
    assert not (tmp_path / "run").exists()


def test_bad_budgets_from_the_environment_json_and_dict_name_where_they_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "5%")
    with pytest.raises(ConfigError, match=r"\$SMDEBUG_OVERHEAD_BUDGET must be a number in \(0, 1\).*'5%'"):
        smd.Hook(out_dir=str(tmp_path / "env"))
    monkeypatch.delenv(BUDGET_ENV)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "json"), "HookParameters": {"overhead_budget": 2}}))
    with pytest.raises(ConfigError, match=r"overhead_budget must be a number in \(0, 1\).*got 2"):
        smd.Hook.create_from_json_file(str(config))
    with pytest.raises(ConfigError, match=r"max_factor must be a power of two.*got 12"):
        smd.Hook(out_dir=str(tmp_path / "dict"), overhead_budget={"fraction": 0.02, "max_factor": 12})


def test_the_level_rises_when_over_and_falls_with_a_margin_when_under():
    """The controller alone, fed costs (fractions of step time) as a rank would measure them."""
    budget = OverheadBudget(BudgetSetting(0.02, max_factor=64), background=lambda: 0.0)
    budget._known = [0.40, 0.0]  # a saved step costs 40% of a step; a plain one nothing
    assert budget._choose(1) == 5  # 0.40 / 32 = 1.25% <= 2%; 0.40 / 16 = 2.5% is over
    budget.level = 5
    budget._known = [0.20, 0.0]  # cheaper now: 0.20 / 16 = 1.25% is within 70% of 2%
    assert budget._choose(1) == 4
    budget.level = 4
    budget._known = [0.27, 0.0]  # 0.27 / 8 = 3.4% over; at 16: 1.7% fits but not with the margin
    assert budget._choose(1) == 4
    budget._known = [0.40, 0.019]  # a plain step alone costs nearly the budget: as far as it goes
    assert budget._choose(1) == 6


def test_two_gloo_ranks_whose_measurements_disagree_choose_the_same_intervals(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, os.path.join(HERE, "ddp_budget.py"), str(run), str(port)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    decisions = [json.loads((run / f"decisions-{rank}.json").read_text()) for rank in (0, 1)]
    assert len(decisions[0]) == len(decisions[1]) == 3
    for mine, theirs in zip(*decisions):
        assert mine["step"] == theirs["step"]
        assert mine["local"] != theirs["local"]  # each rank measured its own cost
        assert mine["agreed"] == theirs["agreed"] == [max(a, b) for a, b in zip(mine["local"], theirs["local"])]
        assert mine["level"] == theirs["level"]
    assert decisions[1][0]["local"][0] > decisions[0][0]["local"][0]  # rank 1's charge made it the costlier
    assert decisions[0][-1]["level"] > 0
    trial = create_trial(str(run))
    grads = trial.tensor("gradient/Sequential_0.weight")
    assert grads.steps()  # every rank saved the same steps: each step is complete on both workers
    assert all(sorted(grads.workers(step)) == ["worker_0", "worker_1"] for step in grads.steps())


def test_ls_and_the_report_say_what_the_budget_did(tmp_path, capsys):
    from smdebug.analysis.cli import main

    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["weights", "gradients"],
                    reduction_config=smd.ReductionConfig(reductions=["mean"]),
                    overhead_budget={"fraction": 1e-6, "max_factor": 4})
    _train(hook, DECISION_PERIOD + 3)
    assert main(["ls", str(tmp_path / "run")]) == 0
    assert "overhead budget  gradients: every 8 steps from step 20; " in capsys.readouterr().out
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "report.html")]) == 0
    assert "weights: every 8 steps from step 20" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("numel", [4, 1 << 16], ids=["stacked", "alone"])
def test_the_cpu_check_sees_a_nan_in_the_imaginary_part_of_a_complex_parameter(numel):
    from smdebug.pytorch.budget_capture import _CpuLayout

    params = [torch.zeros(numel, dtype=torch.cfloat), torch.zeros(numel, dtype=torch.cfloat), torch.zeros(3)]
    layout = _CpuLayout(params)

    def finite(tensors):
        sums = []
        layout.sums(tensors, sums)
        return bool(torch.isfinite(torch.stack(sums).sum()))

    assert finite(params)
    bad = [p.clone() for p in params]
    bad[1][numel - 1] = complex(0.0, float("nan"))
    assert not finite(bad)

"""The flight recorder with PyTorch (docs/flight_recorder.md): a model that turns NaN at step K
keeps the steps before it on disk, names the module that produced the first NaN, and stays
within its memory budget; an exception in the forward pass and a rule's action write it too.
"""
import json
import logging
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

import smdebug.pytorch as smd
from smdebug.exceptions import ConfigError
from smdebug.rules import DumpFlightRecorder
from smdebug.rules import Rule
from smdebug.analysis.rules.actions import RuleEvent

K = 6  # the step whose forward divides by zero
REDUCTIONS = smd.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"])


class Divide(torch.nn.Module):
    """x / denominator: the denominator is set per step and reaches zero at step K."""

    def __init__(self):
        super().__init__()
        self.denominator = 1.0

    def forward(self, x):
        return x / self.denominator


class Net(torch.nn.Module):
    """Linear -> ReLU -> Divide -> Linear -> Linear: the NaN is made by ``divide`` and only
    propagated by the layers after it (and, in the backward pass, before it)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.ReLU()
        self.divide = Divide()
        self.fc2 = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.fc2(self.divide(self.act(self.fc1(x)))))


def train(run_dir, steps=10, save_interval=100, recorder=None, reductions=REDUCTIONS, model=None, raise_at=None,
          on_step=None, include=None, nan_at=K):
    """A seeded SGD run; ``divide``'s denominator is ``nan_at - step`` (zero at step ``nan_at``;
    None: always 1)."""
    torch.manual_seed(0)
    model = model or Net()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=save_interval),
                    reduction_config=reductions, flight_recorder=recorder, include_collections=include)
    hook.register_module(model)
    loss_fn = torch.nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step in range(steps):
        if hasattr(model, "divide"):
            model.divide.denominator = 1.0 if nan_at is None else float(nan_at - step)
        if raise_at == step:
            model.fail = True
        opt.zero_grad()
        try:
            loss = loss_fn(model(x), y)
        except RuntimeError:
            break
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(hook, step)
    hook.close()
    return hook


JITTER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "jitter")


def marker(run_dir):
    with open(os.path.join(run_dir, "flight_recorder", "trigger-worker_0.json")) as fh:
        return json.load(fh)


def reductions_by_step(trial, name):
    tensor = trial.tensor(name)
    return {s: {k: float(v) for k, v in tensor.reduction_values(s).items()} for s in tensor.steps()}


def test_nan_at_step_k_writes_the_steps_before_it_and_names_the_module(tmp_path):
    run_dir = str(tmp_path / "run")
    train(run_dir, recorder=smd.FlightRecorder(steps=4, max_bytes=1 << 20))
    trial = smd.create_trial(run_dir)
    # save_interval=100 saves step 0 only; the recorder wrote steps K-3..K, nothing after K.
    assert trial.steps() == [0, K - 3, K - 2, K - 1, K]
    found = marker(run_dir)
    assert found["trigger"] == "nonfinite" and found["global_step"] == K
    assert found["steps_written"] == [K - 3, K - 2, K - 1, K]
    origin = found["first_nonfinite"]
    assert (origin["module"], origin["module_class"], origin["phase"], origin["what"]) == \
        ("divide", "Divide", "forward", "output 0")
    assert "MSELoss_output_0" in found["nonfinite_tensors"]
    assert trial.flight_recorder_trigger() == found == trial.flight_recorder_trigger("worker_0")

    # The kept steps hold what a run saving every step saves (nothing lost, nothing invented).
    reference_dir = str(tmp_path / "every_step")
    train(reference_dir, save_interval=1, include=["weights", "gradients", "losses"])
    reference = smd.create_trial(reference_dir)
    for name in ("gradient/Net_fc1.weight", "Net_fc2.weight"):
        got, want = reductions_by_step(trial, name), reductions_by_step(reference, name)
        for step in trial.steps():
            assert len(got[step]) == 4
            np.testing.assert_allclose([got[step][k] for k in sorted(got[step])],
                                       [want[step][k] for k in sorted(want[step])], rtol=1e-12, equal_nan=True)
    loss, reference_loss = trial.tensor("MSELoss_output_0"), reference.tensor("MSELoss_output_0")  # losses: values
    for step in trial.steps():
        np.testing.assert_array_equal(loss.value(step), reference_loss.value(step))
    assert np.isfinite(loss.value(K - 1)).all() and not np.isfinite(loss.value(K)).all()


class MidForwardNaN(torch.nn.Module):
    """The NaN is made by the model's own forward code, between two submodules."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 1)
        self.denominator = 1.0

    def forward(self, x):
        return self.second(self.first(x) / self.denominator)


def test_nan_made_between_modules_is_put_on_the_parent(tmp_path):
    run_dir = str(tmp_path / "run")
    model = MidForwardNaN()

    def set_denominator(hook, step):
        model.denominator = float(K - 1 - step)  # zero for the forward of step K

    set_denominator(None, -1)
    train(run_dir, model=model, recorder=smd.FlightRecorder(steps=2), on_step=set_denominator)
    origin = marker(run_dir)["first_nonfinite"]
    assert (origin["module"], origin["module_class"], origin["phase"], origin["what"]) == \
        ("MidForwardNaN", "MidForwardNaN", "forward", "input 0 of second")


class ScaledLoss(torch.nn.Module):
    """MSE divided by a scale that reaches zero: the loss itself turns infinite."""

    scale = 1.0

    def forward(self, pred, target):
        return ((pred - target) ** 2).mean() / self.scale


def test_a_loss_that_turns_infinite_is_named(tmp_path):
    run_dir = str(tmp_path / "run")
    torch.manual_seed(0)
    model, loss_fn = Net(), ScaledLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=100), reduction_config=REDUCTIONS,
                    flight_recorder=smd.FlightRecorder(steps=2))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step in range(5):
        loss_fn.scale = float(3 - step)  # zero at step 3
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    found = marker(run_dir)
    assert found["global_step"] == 3 and found["steps_written"] == [2, 3]
    origin = found["first_nonfinite"]
    assert (origin["module"], origin["phase"], origin["what"]) == ("ScaledLoss", "forward", "output 0")


def test_steps_saved_normally_are_not_written_twice(tmp_path, caplog):
    run_dir = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(run_dir, save_interval=2, recorder=smd.FlightRecorder(steps=4))
    found = marker(run_dir)
    assert found["steps_written"] == [K - 3, K - 1] and found["steps_already_saved"] == [K - 2, K]
    assert smd.create_trial(run_dir).steps() == [0, 2, 3, 4, 5, 6, 8]  # then every 2nd step, as configured
    assert "already published" not in caplog.text


def test_memory_stays_within_the_budget_and_old_steps_are_dropped(tmp_path):
    run_dir = str(tmp_path / "run")
    full = smd.ReductionConfig(save_raw_tensor=True)  # full values: ~1.5 KB of weights a step
    seen = []

    def watch(hook, step):
        ring = hook.session.recorder.ring
        seen.append((ring.bytes_used, len(ring), ring.peak_bytes))

    budget = 3000
    train(run_dir, recorder=smd.FlightRecorder(steps=50, max_bytes=budget, collections=["weights"]), reductions=full,
          on_step=watch)
    assert max(used for used, _, _ in seen) <= budget and max(peak for _, _, peak in seen) <= budget
    assert max(kept for _, kept, _ in seen) < K  # the budget, not the step count, limited the window
    found = marker(run_dir)
    assert found["peak_bytes"] <= budget and found["steps_dropped_for_budget"] > 0
    # Weights only: they turn NaN with the update of step K, so the step after K fires.
    assert found["global_step"] == K + 1 and found["first_nonfinite"]["module"] == "fc1"
    written = found["steps_written"]
    assert written == list(range(K + 2 - len(written), K + 2))  # the most recent steps
    trial = smd.create_trial(run_dir)
    assert trial.tensor("Net_fc1.weight").steps() == [0] + written


class FailingNet(Net):
    fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("boom")
        return super().forward(x)


def test_an_exception_in_the_forward_writes_the_recorder(tmp_path):
    run_dir = str(tmp_path / "run")
    hook = train(run_dir, model=FailingNet(), raise_at=4, nan_at=None, recorder=smd.FlightRecorder(steps=3))
    found = marker(run_dir)
    assert found["trigger"] == "exception" and "RuntimeError" in found["reason"] and "boom" in found["reason"]
    assert found["global_step"] == 4 and found["first_nonfinite"] is None
    assert found["steps_written"] == [2, 3, 4]
    trial = smd.create_trial(run_dir)
    assert trial.steps() == [0, 2, 3, 4]
    assert trial.tensor("FailingNet_fc1.weight").steps() == [0, 2, 3, 4]  # the failing step's weights too
    assert not hook.enabled or not hook.session.flight_recording


def test_with_hook_writes_the_recorder_when_backward_raises(tmp_path):
    run_dir = str(tmp_path / "run")
    torch.manual_seed(0)
    model = Net()
    with pytest.raises(ValueError, match="backward failed"):
        with smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=100), reduction_config=REDUCTIONS,
                      flight_recorder=smd.FlightRecorder(steps=2)) as hook:
            hook.register_module(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for step in range(5):
                opt.zero_grad()
                out = model(torch.randn(8, 4)).sum()
                if step == 3:
                    raise ValueError("backward failed")
                out.backward()
                opt.step()
    found = marker(run_dir)
    assert found["trigger"] == "exception" and found["global_step"] == 3 and found["steps_written"] == [2, 3]


def test_locate_false_installs_no_notes(tmp_path):
    run_dir = str(tmp_path / "run")
    hook = train(run_dir, recorder=smd.FlightRecorder(steps=2, locate=False))
    assert hook._driver.locator.locator is None
    found = marker(run_dir)
    assert found["trigger"] == "nonfinite" and found["global_step"] == K and found["first_nonfinite"] is None


class FiresAtStep(Rule):
    """A live rule that fires at one step."""

    def __init__(self, at, actions=None):
        super().__init__(actions=actions)
        self.at = at

    def invoke_at_step(self, step):
        return step == self.at


def test_a_rule_action_writes_the_recorder(tmp_path):
    run_dir = str(tmp_path / "run")
    model = Net()

    def attach(hook, step):
        if step == 0:
            hook.add_rule(FiresAtStep(6), actions=DumpFlightRecorder(), max_lag_steps=0)

    # Live rules see the saved steps (every 3rd here); the recorder keeps those in between.
    train(run_dir, model=model, save_interval=3, nan_at=None, recorder=smd.FlightRecorder(steps=4), on_step=attach)
    found = marker(run_dir)
    assert found["trigger"] == "rule" and found["reason"].startswith("rule FiresAtStep fired at step 6")
    assert found["global_step"] == 6 and found["first_nonfinite"] is None
    assert found["steps_written"] == [4, 5] and found["steps_already_saved"] == [3, 6]
    assert smd.create_trial(run_dir).steps() == [0, 3, 4, 5, 6, 9]  # then every 3rd step, as configured
    event = RuleEvent(rule="Again", step=7, mode=smd.modes.ModeKeys.TRAIN, mode_step=7, message="", run_dir=run_dir)
    assert "does not run in the training process" in DumpFlightRecorder()(event)


def test_bad_arguments_fail_at_construction(tmp_path):
    for kwargs, text in (({"steps": 0}, "steps must be an integer >= 1"),
                         ({"max_bytes": -1}, "max_bytes must be a positive integer"),
                         ({"collections": []}, "collections must be a non-empty list")):
        with pytest.raises(ConfigError, match=text):
            smd.FlightRecorder(**kwargs)
    with pytest.raises(ConfigError, match="unknown keys size"):
        smd.Hook(out_dir=str(tmp_path / "a"), flight_recorder={"size": 3})
    with pytest.raises(ConfigError, match="must be a smdebug.FlightRecorder"):
        smd.Hook(out_dir=str(tmp_path / "b"), flight_recorder=3)
    hook = smd.Hook(out_dir=str(tmp_path / "c"), flight_recorder={"steps": 3, "collections": "weights"})
    assert (hook.flight_recorder.steps, hook.flight_recorder.collections) == (3, ("weights",))
    hook.close()


def test_json_config_turns_the_recorder_on(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": run_dir, "HookParameters": {
        "save_interval": "100", "reductions": "min,max,mean",
        "flight_recorder": {"steps": 2, "max_bytes": 1000000, "collections": ["losses", "gradients"]}}}))
    hook = smd.Hook.create_from_json_file(str(config))
    assert hook.flight_recorder.collections == ("losses", "gradients") and hook.flight_recorder.steps == 2
    hook.close()
    # SageMaker passes HookParameters values as strings: a JSON object in a string works too.
    config.write_text(json.dumps({"LocalPath": run_dir, "HookParameters": {
        "overwrite": "true", "flight_recorder": json.dumps({"steps": 5})}}))
    hook = smd.Hook.create_from_json_file(str(config))
    assert hook.flight_recorder.steps == 5
    hook.close()


UNCAUGHT_SCRIPT = """
import sys, torch
import smdebug.pytorch as smd
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=100),
                reduction_config=smd.ReductionConfig(reductions=["mean"]), flight_recorder=smd.FlightRecorder(steps=3))
hook.register_module(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    opt.zero_grad()
    out = model(torch.randn(8, 4)).sum()
    if step == 5:
        raise OSError("the data loader went away")  # escapes the script: no with, no close()
    out.backward()
    opt.step()
"""


def test_an_uncaught_exception_writes_the_recorder_before_the_process_ends(tmp_path):
    run_dir = str(tmp_path / "run")
    script = tmp_path / "train.py"
    script.write_text(UNCAUGHT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), run_dir], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "OSError: the data loader went away" in proc.stderr  # the user's traceback
    found = marker(run_dir)
    assert found["trigger"] == "exception" and found["reason"].startswith("uncaught OSError")
    assert found["global_step"] == 5 and found["steps_written"] == [3, 4, 5]
    trial = smd.create_trial(run_dir)
    assert trial.steps() == [0, 3, 4, 5] and trial.training_ended()


def _two_ddp_workers(run_dir: str, env=None) -> str:
    """Run tests/pytorch/ddp_flight.py (two gloo workers, NaN at step 4) and check that both
    workers wrote every tensor of every step they kept, and their markers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_flight.py")
    done = subprocess.run([sys.executable, script, run_dir, str(port)], capture_output=True, text=True, timeout=180,
                          env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    trial = smd.create_trial(run_dir)
    markers = trial.flight_recorder_triggers()
    assert sorted(markers) == ["worker_0", "worker_1"]
    for worker, found in markers.items():
        assert found["trigger"] == "nonfinite" and found["global_step"] == 4 and found["steps_written"] == [2, 3, 4]
        assert found["first_nonfinite"]["module"] == "1"  # the Divide module, inside the DDP wrapper
    assert trial.steps() == [0, 2, 3, 4]
    # Every tensor at every step from both workers; on failure, what each wrote and said.
    written = {name: {step: sorted(trial.tensor(name).workers(step)) for step in trial.tensor(name).steps()}
               for name in trial.tensor_names()}
    incomplete = {name: {s: w for s, w in by_step.items() if w != ["worker_0", "worker_1"]}
                  for name, by_step in written.items()}
    incomplete = {name: by_step for name, by_step in incomplete.items() if by_step}
    assert written["gradient/Sequential_0.weight"].keys() == {0, 2, 3, 4}
    assert not incomplete, f"{incomplete}\nmarkers: {markers}\nstderr: {done.stderr[-4000:]}"
    return done.stderr


def test_two_ddp_workers_each_write_their_steps_and_marker(tmp_path):
    _two_ddp_workers(str(tmp_path / "run"))


def test_two_ddp_workers_under_timing_jitter_lose_nothing(tmp_path):
    """The same with the hook's threads delayed at random (tests/support/jitter): the orders of
    events that races need. One such race (a worker's close removing the shared, empty
    store/live while the other made its folder in it) cost a whole worker's steps in one CI
    run; the writer's own test of it is deterministic (test_store_writer.py)."""
    stderr = _two_ddp_workers(str(tmp_path / "run"), {
        "SMDEBUG_TEST_JITTER": "0.05",
        "PYTHONPATH": os.pathsep.join(filter(None, [JITTER_DIR, os.environ.get("PYTHONPATH")]))})
    assert stderr.count("smdebug test jitter: writer items delayed up to 0.05 s") >= 2, stderr[-3000:]  # both workers


def test_a_sharded_activations_note_is_this_ranks_part_not_a_dtensor(tmp_path):
    """Sequence-parallel modules return DTensors: a note keeps this rank's local sum, so
    reading it when the recorder fires starts no collective on that one rank."""
    script = (
        "import os, socket, torch, torch.distributed as dist\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.tensor import DTensor, Shard, distribute_tensor\n"
        "from smdebug.pytorch.nonfinite import _finite_note\n"
        "note = _finite_note(distribute_tensor(torch.tensor([1.0, float('nan')]), init_device_mesh('cpu', (1,)), [Shard(0)]))\n"
        "print(type(note) is torch.Tensor and not isinstance(note, DTensor), bool(torch.isnan(note)))\n"
        "dist.destroy_process_group()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"]

"""Rules while training runs: live in the training process (hook.add_rule), and from another process."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError
from smdebug.rules import (
    AllZero, ExplodingTensor, LossNotDecreasing, Overfit, Required, Rule, StopTraining, TensorVariance,
    UnchangedTensor, VanishingGradient, WeightUpdateRatio, invoke_rule,
)
from smdebug.analysis.rules.live import close_live_rules
from smdebug.trials import create_trial


def exploding_loss(step, explode_at):
    return float("inf") if step >= explode_at else 1.0 / (step + 1)


def train(hook, steps, explode_at=None, record_extra=None):
    """A numpy training loop that honours hook.stop_requested at each step boundary, as adapters do.

    Returns the last step whose work completed.
    """
    last_done = -1
    for _ in range(steps):
        hook.begin_step()
        if hook.stop_requested:
            break
        step = hook.global_step
        hook.save_scalar("loss", exploding_loss(step, explode_at if explode_at is not None else 10 ** 9))
        hook.record("gradient/fc.weight", np.full((8, 8), 1e-3, np.float32))
        if record_extra is not None:
            record_extra(hook, step)
        last_done = step
    hook.close()
    return last_done


def make_hook(path, **kwargs):
    kwargs.setdefault("save_config", smd.SaveConfig(save_interval=1))
    kwargs.setdefault("include_collections", ["gradients"])
    return smd.Hook(out_dir=str(path), **kwargs)


def test_exploding_loss_stops_training_at_the_next_step_boundary(tmp_path):
    hook = make_hook(tmp_path / "run")
    live = hook.add_rule(ExplodingTensor(collection_names="losses"), actions=StopTraining())
    last_done = train(hook, 50, explode_at=7)
    assert last_done == 7  # the triggering step is the last one that ran
    assert live.violation_steps[0] == 7
    reason = json.load(open(tmp_path / "run" / "training_stop_reason.json"))["reason"]
    assert reason.startswith("ExplodingTensor fired at step 7")
    live.close()
    doc = json.load(open(tmp_path / "run" / "rule_reports" / "ExplodingTensor.json"))
    assert doc["live"] is True and doc["status"] == "finished" and doc["violations"][0]["step"] == 7
    assert doc["actions"][0]["action"] == "StopTraining"
    assert create_trial(str(tmp_path / "run")).steps()[-1] == 7


def test_overlapped_evaluation_stops_one_step_later_at_most(tmp_path):
    hook = make_hook(tmp_path / "run")
    live = hook.add_rule(ExplodingTensor(collection_names="losses"), actions=StopTraining(), max_lag_steps=1)
    last_done = train(hook, 50, explode_at=7)
    assert 7 <= last_done <= 8
    assert live.violation_steps[0] == 7


def test_live_and_offline_evaluation_agree(tmp_path):
    """The same rules, live on StepValues and offline on the written run, find the same steps."""
    def extra(hook, step):
        hook.record("fc.weight", np.full(20, 1.0) if step in (3, 4, 5) else np.full(20, float(step)))
        hook.record("fc.bias", np.zeros(4) if step == 6 else np.ones(4))
        hook.record("gradient/fc.bias", np.full(4, 1e-9 if step >= 8 else 1.0))
        hook.save_scalar("val_loss", 0.5 if step < 5 else 3.0)

    def rules():
        return [VanishingGradient(), ExplodingTensor(), LossNotDecreasing(num_steps=3),
                Overfit(), AllZero(collection_names="biases"), UnchangedTensor(collection_names="weights"),
                TensorVariance(collection_names=["weights", "gradients"], max_threshold=0.5, min_threshold=1e-12),
                WeightUpdateRatio(large_threshold=0.5)]

    rc = smd.ReductionConfig(abs_reductions=["mean"], reductions=["min", "max"], save_raw_tensor=True)
    hook = make_hook(tmp_path / "run", include_collections=["gradients", "weights", "biases"], reduction_config=rc)
    lives = [hook.add_rule(rule) for rule in rules()]
    train(hook, 12, explode_at=10, record_extra=extra)
    close_live_rules(hook)
    trial = create_trial(str(tmp_path / "run"))
    offline = {r.rule_name: invoke_rule(type(r)(trial, **_params(r)), report_path=None).violation_steps
               for r in rules()}
    live = {lr.rule.rule_name: lr.violation_steps for lr in lives}
    assert live == offline
    assert all(offline.values()), offline  # every rule fired somewhere in this run
    assert all(lr.report.to_dict()["status"] == "finished" for lr in lives)


def _params(rule):
    return {k: v for k, v in rule.parameters().items()}


def test_a_failing_live_rule_is_detached_and_training_goes_on(tmp_path):
    class Broken(Rule):
        def invoke_at_step(self, step):
            if step == 2:
                raise ZeroDivisionError("bug in the rule")
            return False

    class ReadsTheTrial(Rule):
        def invoke_at_step(self, step):
            return bool(self.base_trial.tensor_names())

    hook = make_hook(tmp_path / "run")
    broken, old_style = hook.add_rule(Broken()), hook.add_rule(ReadsTheTrial())
    assert train(hook, 6) == 5
    broken.wait(30)
    assert not broken.active and "bug in the rule" in broken.error
    assert broken.report.to_dict()["datapoints"] == 2
    assert not old_style.active and "read the step's data through self.view" in old_style.error


def test_attach_rule_checks_its_arguments(tmp_path):
    hook = make_hook(tmp_path / "run")
    rule = VanishingGradient()
    hook.add_rule(rule, report_path=None)
    with pytest.raises(ConfigError, match="already attached"):
        hook.add_rule(rule)
    with pytest.raises(ConfigError, match="Rule instance"):
        hook.add_rule(VanishingGradient)
    with pytest.raises(ConfigError, match="max_lag_steps"):
        hook.add_rule(VanishingGradient(), max_lag_steps=-1)
    hook.close()


def test_the_hook_polls_the_stop_request_file_at_step_boundaries(tmp_path, monkeypatch):
    from smdebug.rules import write_stop_request

    monkeypatch.setenv("SMDEBUG_STOP_CHECK_INTERVAL_S", "0")
    write_stop_request(str(tmp_path), "left over from an earlier run")  # must not stop the new run
    hook = make_hook(tmp_path)
    hook.begin_step()
    assert not hook.stop_requested
    write_stop_request(hook.out_dir, "stop from outside")
    hook.begin_step()
    assert hook.stop_reason == "stop from outside"
    hook.close()


# --- another process -----------------------------------------------------------------------------------
TRAINER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import smdebug as smd
    from smdebug.rules import StopRequestPoller

    out_dir, steps, explode_at, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"])
    # What the hook does itself once Hook.begin_step polls the stop-request file.
    poller = StopRequestPoller(out_dir, interval_s=0.02)
    last_done = -1
    for _ in range(steps):
        hook.begin_step()
        if poller.check(hook) or hook.stop_requested:
            break
        step = hook.global_step
        hook.save_scalar("loss", float("inf") if step >= explode_at else 1.0 / (step + 1))
        hook.record("gradient/w", np.full(16, step, np.float32))
        last_done = step
        time.sleep(pause)
    hook.close()
    print(json.dumps({"last_done": last_done, "stop_reason": hook.stop_reason}))
    """
)


@pytest.fixture
def trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    procs = []

    def start(steps, explode_at, pause):
        run = str(tmp_path / "run")
        proc = subprocess.Popen([sys.executable, str(script), run, str(steps), str(explode_at), str(pause)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return run, proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


class SeenSteps(Rule):
    def __init__(self, base_trial=None):
        super().__init__(base_trial)
        self.seen = []

    def required_tensors(self, step):
        return [Required(collections="gradients", value=True)]

    def invoke_at_step(self, step):
        self.seen.append((step, float(self.view.value("gradient/w")[0])))
        return False


def test_following_a_run_written_by_another_process_sees_every_step_once(trainer):
    run, proc = trainer(steps=25, explode_at=10 ** 6, pause=0.03)
    trial = create_trial(run, wait_timeout=60)
    assert not trial.training_ended()  # the rule starts while the other process trains
    rule = SeenSteps(trial)
    invoke_rule(rule, poll_interval=0.02, idle_timeout=60, report_path=None)
    assert proc.wait(timeout=60) == 0
    assert rule.seen == [(s, float(s)) for s in range(25)]
    assert rule.report.to_dict()["status"] == "finished"


def test_a_rule_in_another_process_stops_training_through_the_stop_file(trainer):
    run, proc = trainer(steps=400, explode_at=10, pause=0.02)
    trial = create_trial(run, wait_timeout=60)
    report = invoke_rule(ExplodingTensor(trial, collection_names="losses"), actions=StopTraining(),
                         poll_interval=0.02, idle_timeout=60, report_path=None)
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert report.violation_steps[0] == 10
    assert 10 <= result["last_done"] < 399  # stopped long before the end
    assert result["stop_reason"].startswith("ExplodingTensor fired at step 10")
    assert os.path.exists(os.path.join(run, "training_stop_reason.json"))

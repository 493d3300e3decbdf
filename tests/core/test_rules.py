"""Rule engine: invoke_rule over real runs, reports, batched reads, actions, the stop protocol, the CLI."""
import json
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError, RuleEvaluationConditionMet
from smdebug.rules import (
    Callback, ExplodingTensor, LogMessage, Required, Rule, StalledTrainingRule, StopRequestPoller, StopTraining,
    VanishingGradient, invoke_rule, read_stop_request, run_rules, write_stop_request,
)
from smdebug.analysis.rules.actions import as_actions
from smdebug.analysis.rules.cli import main as cli_main
from smdebug.storage.stop_request import STOP_REQUEST_FILE
from smdebug.analysis.rules.views import TrialStepView
from smdebug.trials import create_trial


def write_run(path, steps, record, reduction_config=None, collections=("gradients",), close=True):
    hook = smd.Hook(out_dir=str(path), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=list(collections), reduction_config=reduction_config)
    for i in range(steps):
        hook.begin_step()
        record(hook, i)
    if close:
        hook.close()
    return hook


def vanishing_from(first_tiny):
    def record(hook, i):
        scale = 1e-9 if i >= first_tiny else 1e-2
        hook.record("gradient/fc1.weight", np.full((8, 4), scale, np.float32))
        hook.record("gradient/fc2.weight", np.full((4,), 0.5, np.float32))
        hook.save_scalar("loss", 1.0 / (i + 1))
    return record


@pytest.fixture
def run(tmp_path):
    write_run(tmp_path / "run", 6, vanishing_from(3))
    return str(tmp_path / "run")


class CountingRule(Rule):
    """Records the steps it sees and what the batch gave it; fires on steps in ``fire_at``."""

    def __init__(self, base_trial=None, fire_at=(), name=None):
        super().__init__(base_trial, name=name)
        self.fire_at = tuple(fire_at)
        self.seen = []

    def required_tensors(self, step):
        return [Required(collections="gradients", value=True, reductions=[("l2", False)])]

    def invoke_at_step(self, step):
        self.seen.append(step)
        if step in self.fire_at:
            self.note(f"asked to fire at {step}", step=step)
            return True
        return False


# --- invoke_rule -------------------------------------------------------------------------------
def test_invoke_rule_writes_the_report_with_violations_and_parameters(run, tmp_path):
    report = invoke_rule(VanishingGradient(create_trial(run)))
    assert report.violation_steps == [3, 4, 5]
    assert not os.path.exists(os.path.join(run, "rule_reports"))  # nothing written unless asked
    path = str(tmp_path / "reports" / "VanishingGradient.json")
    invoke_rule(VanishingGradient(create_trial(run)), report_path=path)
    doc = json.load(open(path))
    assert doc["rule"] == "VanishingGradient" and doc["status"] == "finished"
    assert doc["parameters"] == {"threshold": 1e-07}
    assert doc["triggered"] == 3 and doc["datapoints"] == 6
    assert (doc["first_step"], doc["last_step"]) == (0, 5)
    first = doc["violations"][0]
    assert first["step"] == 3 and first["mode"] == "GLOBAL" and "gradient/fc1.weight" in first["message"]
    assert first["details"]["tensors"] == {"gradient/fc1.weight": pytest.approx(1e-9, rel=1e-3)}
    assert doc["rule_class"] == "smdebug.analysis.rules.builtin_tensors.VanishingGradient"


def test_raise_eval_cond_stops_at_the_first_firing_after_recording_it(run, tmp_path):
    rule = VanishingGradient(create_trial(run))
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(rule, raise_eval_cond=True, report_path=str(tmp_path / "r.json"))
    assert (info.value.rule_name, info.value.step) == ("VanishingGradient", 3)
    doc = json.load(open(tmp_path / "r.json"))
    assert doc["triggered"] == 1 and doc["status"] == "finished" and doc["last_step"] == 3


def test_start_and_end_step_bound_the_evaluated_steps(run):
    rule = CountingRule(create_trial(run))
    invoke_rule(rule, start_step=2, end_step=5, report_path=None)
    assert rule.seen == [2, 3, 4]
    with pytest.raises(ValueError, match="end_step"):
        invoke_rule(CountingRule(create_trial(run)), start_step=3, end_step=3)


def test_follow_false_returns_at_once_on_a_run_still_training(tmp_path):
    hook = write_run(tmp_path / "run", 4, vanishing_from(10), close=False)
    hook.flush(timeout=30)
    trial = create_trial(str(tmp_path / "run"))
    assert not trial.training_ended()
    rule = CountingRule(trial)
    invoke_rule(rule, follow=False, report_path=None)
    assert rule.seen == trial.steps() and rule.seen  # what is there, then back
    hook.close()


def test_original_style_rule_reading_base_trial_works(run):
    class OldStyle(Rule):
        def __init__(self, base_trial, threshold=1e-7):
            super().__init__(base_trial)
            self.threshold = float(threshold)

        def invoke_at_step(self, step):
            for name in self.base_trial.tensor_names(collection="gradients"):
                if self.base_trial.tensor(name).reduction_value(step, "mean", abs=True) < self.threshold:
                    return True
            return False

    trial = create_trial(run)
    assert invoke_rule(OldStyle(trial), report_path=None).violation_steps == [3, 4, 5]
    rule = OldStyle(trial)
    rule.invoke(1)  # the original per-step API: no exception = did not fire
    with pytest.raises(RuleEvaluationConditionMet):
        rule.invoke(4)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_required_tensors_are_read_in_one_batch_per_step(tmp_path):
    names = [f"gradient/layer{i}.weight" for i in range(20)]

    def record(hook, i):
        for n in names:
            hook.record(n, np.full((16,), i + 1.0, np.float32))

    write_run(tmp_path / "run", 3, record, reduction_config=smd.ReductionConfig(norms=["l2"], save_raw_tensor=True))
    trial = create_trial(str(tmp_path / "run"))
    rules = [CountingRule(trial), CountingRule(trial, name="Second")]
    reads = trial.stats["event_reads"]
    run_rules(rules, report_paths={id(r): None for r in rules})
    assert rules[0].seen == rules[1].seen == [0, 1, 2]
    # The saved l2 norms of all steps in bulk (one read per event file: 3), then the 20 values
    # of each step for two rules: one read per step.
    assert trial.stats["event_reads"] - reads == 3 + 3
    view = TrialStepView(trial, 2)
    view.prefetch(rules[0].required_tensors(2))
    assert view.records_read == 40
    np.testing.assert_array_equal(view.value(names[0]), np.full((16,), 3.0, np.float32))
    assert view.reduction(names[0], "l2") == pytest.approx(12.0)


def test_batched_and_per_tensor_reads_agree(tmp_path, monkeypatch):
    def record(hook, i):
        hook.record("gradient/a", np.arange(6, dtype=np.float32) * (i + 1))
        hook.record("gradient/b", np.full((3,), -2.0 * i))

    write_run(tmp_path / "run", 2, record, reduction_config=smd.ReductionConfig(
        reductions=["max"], abs_reductions=["mean"], save_raw_tensor=False))
    trial = create_trial(str(tmp_path / "run"))
    required = [Required(collections="gradients", reductions=[("mean", True), ("max", False)],
                         saved_reductions=True, first_of=("value", "saved_reductions"))]
    batched = TrialStepView(trial, 1)
    batched.prefetch(required)

    def unavailable(self, needs):
        raise AttributeError("simulated: no index internals")

    monkeypatch.setattr(TrialStepView, "_prefetch_batched", unavailable)
    each = TrialStepView(trial, 1)
    each.prefetch(required)
    for name in ("gradient/a", "gradient/b"):
        assert batched.saved_reductions(name) == each.saved_reductions(name)
        assert batched.reduction(name, "mean", abs=True) == each.reduction(name, "mean", abs=True)
        assert batched.first_of(name)[0] == each.first_of(name)[0] == "saved_reductions"
    assert batched.reduction("gradient/a", "mean", abs=True) == pytest.approx(5.0)


# --- actions -----------------------------------------------------------------------------------
def test_actions_log_call_back_and_survive_a_failing_one(run, caplog):
    events = []

    def broken(event):
        raise RuntimeError("callback bug")

    rule = VanishingGradient(create_trial(run), actions=[broken, LogMessage(level="error")])
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        report = invoke_rule(rule, actions=Callback(events.append), report_path=None)
    assert [e.step for e in events] == [3, 4, 5]
    assert events[0].rule == "VanishingGradient" and events[0].hook is None and events[0].run_dir == run
    assert "gradient/fc1.weight" in events[0].details["tensors"]
    assert sum("rule VanishingGradient fired at step" in r.getMessage() for r in caplog.records) == 3
    doc = report.to_dict()
    assert any("callback bug" in e for e in doc["errors"])
    actions = [a["action"] for a in doc["actions"] if a["step"] == 3]
    assert actions[0].endswith("<locals>.broken)") and actions[1:] == ["LogMessage", "Callback(list.append)"]


def test_as_actions_names_and_errors():
    assert [type(a) for a in as_actions(["stoptraining", "log"])] == [StopTraining, LogMessage]
    with pytest.raises(ConfigError, match="unknown action 'email'"):
        as_actions("email")
    with pytest.raises(ConfigError, match="not a valid template"):
        LogMessage(message="{nope}")
    with pytest.raises(ConfigError, match="level"):
        LogMessage(level="loud")


def test_stop_training_out_of_process_writes_the_request_file(run):
    invoke_rule(VanishingGradient(create_trial(run)), actions=StopTraining(), report_path=None)
    reason = read_stop_request(run)
    assert reason.startswith("VanishingGradient fired at step 3")
    doc = json.load(open(os.path.join(run, STOP_REQUEST_FILE)))
    assert doc["rule"] == "VanishingGradient" and doc["step"] == 3 and doc["pid"] == os.getpid()


# --- stop protocol -----------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_as_stop_request_does_not_block_the_training_thread(tmp_path):
    import threading

    out = str(tmp_path)
    poller = StopRequestPoller(out, interval_s=0)
    os.mkfifo(os.path.join(out, STOP_REQUEST_FILE))  # appears mid-run
    box = []
    thread = threading.Thread(target=lambda: box.append(poller.poll()), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "poll() blocked on the FIFO"
    assert "not a regular file" in box[0]  # existence is still the request


def test_stop_request_round_trip_malformed_and_stale(tmp_path):
    out = str(tmp_path)
    assert read_stop_request(out) is None
    write_stop_request(out, "enough", rule="R", step=3)
    assert read_stop_request(out) == "enough"
    with open(os.path.join(out, STOP_REQUEST_FILE), "w") as fh:
        fh.write("{not json")
    assert "no readable reason" in read_stop_request(out)  # existence is the request
    poller = StopRequestPoller(out, interval_s=0)  # removes the stale request
    assert not os.path.exists(os.path.join(out, STOP_REQUEST_FILE))
    assert poller.poll() is None
    with pytest.raises(ValueError, match="reason"):
        write_stop_request(out, "  ")
    with pytest.raises(ValueError, match="interval_s"):
        StopRequestPoller(out, interval_s=-1)


def test_poller_touches_the_disk_at_most_once_per_interval_and_stops_a_hook(tmp_path, monkeypatch):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    poller = StopRequestPoller(hook.out_dir, interval_s=3600)
    stats = []
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: stats.append(p) or real_exists(p))
    assert poller.check(hook) is False  # first call looks
    write_stop_request(hook.out_dir, "rule X says stop")
    for _ in range(100):
        assert poller.check(hook) is False  # not due yet: no stat
    assert stats.count(poller.path) == 1
    poller._next_check = 0  # the interval has passed
    assert poller.check(hook) is True
    assert hook.stop_requested and hook.stop_reason == "rule X says stop"
    hook.close()
    assert json.load(open(tmp_path / "run" / "training_stop_reason.json"))["reason"] == "rule X says stop"


# --- time-based rule -----------------------------------------------------------------------------
def test_stalled_training_fires_while_following_a_silent_run(tmp_path):
    hook = write_run(tmp_path / "run", 2, vanishing_from(10), close=False)
    hook.flush(timeout=30)
    rule = StalledTrainingRule(create_trial(str(tmp_path / "run")), threshold=0.3)
    report = invoke_rule(rule, poll_interval=0.05, idle_timeout=1.0, report_path=None)
    doc = report.to_dict()
    # Step 1 is still open (not ended), so step 0 is the last saved one.
    assert doc["triggered"] == 1 and doc["violations"][0]["step"] == 0  # once per stall, at the last step
    assert "no new step saved" in doc["violations"][0]["message"]
    hook.close()
    finished = StalledTrainingRule(create_trial(str(tmp_path / "run")), threshold=0.3)
    assert invoke_rule(finished, report_path=None).triggered == 0  # a finished run is not stalled


# --- parameters ------------------------------------------------------------------------------------
@pytest.mark.parametrize("factory, message", [
    (lambda: VanishingGradient(threshold="tiny"), "threshold='tiny'"),
    (lambda: VanishingGradient(threshold=-1), "threshold=-1"),
    (lambda: ExplodingTensor(only_nan="maybe"), "only_nan='maybe'"),
    (lambda: ExplodingTensor(tensor_regex="(unclosed"), "not a valid regular expression"),
])
def test_bad_parameters_fail_fast_naming_the_parameter(factory, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        factory()


def test_string_parameters_as_sagemaker_passes_them():
    rule = ExplodingTensor(collection_names="gradients, weights", only_nan="True")
    assert rule.collection_names == ("gradients", "weights") and rule.only_nan is True
    assert VanishingGradient(threshold="1e-5").threshold == 1e-5


# --- CLI ---------------------------------------------------------------------------------------------
def test_cli_exit_codes_summary_lines_and_reports_only_when_asked(run, tmp_path, capsys):
    assert cli_main([run, "--rules", "VanishingGradient", "--no-progress"]) == 1
    out = capsys.readouterr().out
    # one line per rule and the culprit of its first firing, no per-step lines
    assert out.count("\n") == 2
    assert out.splitlines()[1].split() == ["culprit:", "layer", "fc1", "(gradient/fc1.weight),", "from", "step", "3"]
    assert out.startswith("VanishingGradient  FIRED at 3 of 6 evaluated steps (first 3, last 5); worst mean "
                          "|gradient| 1e-09 at step 3: 1 of 2 gradients")
    assert not os.path.exists(os.path.join(run, "rule_reports"))  # nothing written unless asked
    assert cli_main([run, "--rules", "VanishingGradient", "--verbose", "--no-progress"]) == 1
    verbose = capsys.readouterr().out
    assert "step 3 (GLOBAL 3): VanishingGradient:" in verbose and "step 5 (GLOBAL 5)" in verbose
    reports = tmp_path / "reports"
    assert cli_main([run, "--rules", "vanishinggradient,ExplodingTensor", "--param",
                     "VanishingGradient.threshold=1e-12", "--report", str(reports), "--no-progress"]) == 0
    doc = json.load(open(reports / "summary.json"))
    assert set(doc["rules"]) == {"VanishingGradient", "ExplodingTensor"}
    assert doc["rules"]["VanishingGradient"]["parameters"]["threshold"] == 1e-12
    assert json.load(open(reports / "ExplodingTensor.json"))["status"] == "finished"
    assert not os.path.exists(os.path.join(run, "rule_reports"))
    assert "did not fire: 6 of 6 steps evaluated" in capsys.readouterr().out
    assert cli_main([run, "--rules", "NoSuchRule"]) == 2
    assert "unknown rule 'NoSuchRule'" in capsys.readouterr().err
    assert cli_main([run, "--rules", "VanishingGradient", "--param", "VanishingGradient.thresh=1"]) == 2
    assert "has no parameter 'thresh'" in capsys.readouterr().err
    assert cli_main([run, "--rules", "AllZero"]) == 2  # needs a selection
    assert cli_main([str(tmp_path / "missing")]) == 2
    assert "missing does not exist; runs found below" in capsys.readouterr().err
    assert cli_main([run, "--bogus-flag"]) == 2
    assert cli_main([run, "--report", "s3://bucket/reports"]) == 2
    assert "reports are written to a local directory" in capsys.readouterr().err
    assert not os.path.exists("s3:")
    os.makedirs(tmp_path / "empty")
    assert cli_main([str(tmp_path / "empty")]) == 3
    assert "cannot read" in capsys.readouterr().err


def test_cli_persistent_nan_is_one_line_and_did_not_fire_counts_what_was_evaluated(tmp_path, capsys):
    def record(hook, i):
        if hook.mode is smd.modes.TRAIN:
            hook.record("gradient/w", np.full(4, np.nan if i >= 2 else 0.5, np.float32))
        hook.save_scalar("loss", 1.0)

    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients"])
    for mode, n in ((smd.modes.TRAIN, 30), (smd.modes.EVAL, 20)):
        hook.set_mode(mode)
        for _ in range(n):
            hook.begin_step()
            record(hook, hook.global_step)
    hook.close()
    assert cli_main([str(tmp_path / "run"), "--rules", "ExplodingTensor,VanishingGradient", "--no-progress"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ExplodingTensor    FIRED at 28 of 50 evaluated steps (first 2, last 29); worst "
                               "tensors with NaN/inf 1 at step 2")
    assert len(lines) == 3
    assert lines[1].split() == ["culprit:", "layer", "w", "(gradient/w),", "from", "step", "2"]
    assert lines[2] == ("VanishingGradient  did not fire: 30 of 50 steps evaluated, all fine; 20 steps had nothing to "
                        "read (20 EVAL): gradients saved at other steps (30 TRAIN steps; e.g. gradient/w)")


def test_cli_follow_waits_for_the_end_or_the_idle_timeout(tmp_path, capsys):
    hook = write_run(tmp_path / "run", 5, vanishing_from(2), close=False)
    hook.flush(timeout=30)
    run = str(tmp_path / "run")
    assert cli_main([run, "--rules", "VanishingGradient", "--follow", "--idle-timeout", "0.3",
                     "--poll-interval", "0.05", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.count("step 2 (GLOBAL 2): VanishingGradient:") == 1  # following: the first firing, once
    assert "FIRED at 2 of 4 evaluated steps (first 2, last 3)" in out  # step 4 is still open
    hook.close()
    assert cli_main([run, "--rules", "VanishingGradient", "--follow", "--no-progress"]) == 1
    assert "FIRED at 3 of 5 evaluated steps (first 2, last 4)" in capsys.readouterr().out


def test_cli_follow_waits_for_a_run_directory_that_does_not_exist_yet(tmp_path, capsys):
    run = tmp_path / "later"

    def train_later():
        time.sleep(0.5)
        write_run(run, 4, vanishing_from(1))

    thread = threading.Thread(target=train_later)
    thread.start()
    try:
        assert cli_main([str(run), "--rules", "VanishingGradient", "--follow", "--poll-interval", "0.05",
                         "--no-progress"]) == 1
    finally:
        thread.join()
    assert "FIRED at 3 of 4 evaluated steps (first 1, last 3)" in capsys.readouterr().out


def test_cli_list_is_not_cut(capsys):
    assert cli_main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "XGBoost's trees/<column> tensors" in out  # the end of ExplodingTensor's description (markup removed)
    assert "delta_relative=0.01" in out and "from convergence without" not in out and "evaluation passes" in out


def test_cli_default_rules_follow_what_the_run_contains(run, tmp_path, capsys):
    assert cli_main([run, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("deep-learning run, collections with saved tensors: gradients, losses; running 4 of the "
                          "default rules, skipping 9:")
    assert "  skipped Overtraining: no validation loss" in out
    assert "  skipped TreeDepth: reads XGBoost trees/feature importance; this is a deep-learning run" in out
    assert "  skipped Overfit: no validation loss" in out
    assert "  skipped WeightUpdateRatio: the 'weights' collection was not saved" in out
    ran = [line.split()[0] for line in out.splitlines() if not line.startswith(("  ", "deep-learning"))]
    assert ran == ["VanishingGradient", "ExplodingTensor", "LossNotDecreasing", "LossSpike"]


def test_cli_as_module_in_a_real_process(run):
    proc = subprocess.run([sys.executable, "-m", "smdebug.rules", run, "--rules", "ExplodingTensor,VanishingGradient",
                           "--param", "ExplodingTensor.collection_names=gradients,losses", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "ExplodingTensor" in proc.stdout and "did not fire" in proc.stdout
    listing = subprocess.run([sys.executable, "-m", "smdebug.rules", "--list"], capture_output=True, text=True,
                             timeout=120)
    assert listing.returncode == 0 and "TreeDepth" in listing.stdout and "depth=6" in listing.stdout


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_a_step_whose_files_cannot_be_read_is_skipped_and_the_rest_evaluated(tmp_path, capsys):
    out = str(tmp_path / "run")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    for step in range(6):
        hook.begin_step()
        hook.save_tensor("fc.weight", np.full(4, np.nan if step == 4 else 1.0, np.float32), "weights")
    hook.close()
    event = os.path.join(out, "events", "000000000001", "000000000001_worker_0.tfevents")
    os.truncate(event, os.path.getsize(event) // 2)
    report = invoke_rule(ExplodingTensor(create_trial(out)), report_path=None).to_dict()
    assert report["violations"][0]["step"] == 4 and report["triggered"] == 1  # past the damaged step
    assert report["datapoints"] == 5 and report["steps_without_data"] == 1
    assert len(report["errors"]) == 1 and report["errors"][0].startswith("step 1 skipped: ")
    assert cli_main([out, "--rules", "ExplodingTensor", "--no-progress"]) == 1
    assert "1 step skipped, unreadable (first: step 1 skipped: " in capsys.readouterr().out

"""The flight recorder's core (smdebug_core/capture/flight_recorder.py): the ring's byte accounting,
the NaN/Inf check from reductions, and a numpy-hook run end to end (docs/flight_recorder.md)."""
import json
import os
import random
import time

import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError
from smdebug.capture.flight_recorder import StepRing, nonfinite_rows, value_is_nonfinite


def test_ring_never_holds_more_than_its_budget_and_drops_oldest_first():
    rng = random.Random(0)
    ring = StepRing(max_steps=5, max_bytes=1000)
    added = []
    for step in range(500):
        nbytes = rng.choice([0, 10, 100, 300, 700, 999, 1000, 1001, 5000])
        kept = ring.add(step, object() if rng.random() < 0.9 else None, nbytes)
        if kept:
            added.append(step)
        assert ring.bytes_used <= 1000 and ring.peak_bytes <= 1000 and len(ring) <= 5
        keys = ring.keys()
        assert keys == added[-len(keys):]  # the most recent steps, in order: older ones went first
    assert ring.too_large > 0 and ring.dropped_old > 0 and ring.dropped_for_budget > 0
    taken = ring.take()
    assert [key for key, _ in taken] == keys and ring.bytes_used == 0 and len(ring) == 0


def test_ring_counts_saved_steps_as_recent_without_bytes():
    ring = StepRing(max_steps=3, max_bytes=100)
    ring.add(0, "kept", 60)
    ring.add(1, None, 0)  # saved normally
    ring.add(2, "kept", 30)
    assert ring.bytes_used == 90
    ring.add(3, "kept", 50)  # 3 steps at most, and 140 > 100: steps 0 goes
    assert ring.keys() == [1, 2, 3] and ring.bytes_used == 80


def test_nonfinite_rows_and_values():
    table = np.array([[1.0, 2.0], [np.nan, 1.0], [0.0, np.inf], [3.0, 4.0]])
    keys = (("min", False), ("max", False))
    assert list(nonfinite_rows(table, keys)) == [1, 2]
    assert nonfinite_rows(np.ones((3, 2)), keys) is None and nonfinite_rows(None, keys) is None
    assert value_is_nonfinite(np.array([1.0, -np.inf])) and not value_is_nonfinite(np.arange(3))
    assert not value_is_nonfinite(np.array([], dtype=np.float32))
    import ml_dtypes  # raw bfloat16 values reach the core as ml_dtypes arrays (kind "V")

    assert value_is_nonfinite(np.array([1.0, np.nan], dtype=ml_dtypes.bfloat16))
    assert not value_is_nonfinite(np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16))


def test_health_reductions_undefined_for_a_tensor_do_not_fire_it(tmp_path):
    """A 1-element tensor's kurtosis and a tensor of zeros' underflow fraction are NaN by
    definition: the recorder fires on the tensor that holds an infinity, at its step."""
    keys = (("min", False), ("kurtosis", False), ("underflow_bf16", False), ("nonfinite", False))
    table = np.array([[0.5, np.nan, np.nan, 0.0], [np.inf, np.nan, 0.0, 1.0], [0.1, 3.0, 0.0, 0.0]])
    assert list(nonfinite_rows(table, keys)) == [1]
    counted = (("kurtosis", False), ("nonfinite", False))  # a health-only table: the count tells
    assert list(nonfinite_rows(np.array([[np.nan, 0.0], [np.nan, 2.0]]), counted)) == [1]
    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=100), include_regex=["w", "b", "z"],
                    reduction_config=smd.ReductionConfig(reductions=["max", "kurtosis", "underflow_bf16"]),
                    flight_recorder=smd.FlightRecorder(steps=3, collections="default"))
    for step in range(8):
        hook.begin_step()
        hook.record("b", np.array([0.25]))
        hook.record("z", np.zeros(4))
        with np.errstate(divide="ignore"):
            hook.record("w", np.ones(4) / (6 - step))
    hook.close()
    with open(os.path.join(run_dir, "flight_recorder", "trigger-worker_0.json")) as fh:
        marker = json.load(fh)
    assert marker["global_step"] == 6 and marker["nonfinite_tensors"] == ["w"]


def _numpy_run(run_dir, steps=10, bad_at=6, save_interval=100, recorder=None):
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=save_interval), include_regex=["w"],
                    reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean"]),
                    flight_recorder=recorder or smd.FlightRecorder(steps=3, collections="default"))
    for step in range(steps):
        hook.begin_step()
        with np.errstate(divide="ignore"):
            hook.record("w", np.ones(4) / (bad_at - step))
        hook.save_scalar("loss", float(step))
    hook.close()
    return hook


def test_numpy_hook_writes_the_kept_steps_with_their_scalars(tmp_path, caplog):
    run_dir = str(tmp_path / "run")
    _numpy_run(run_dir)
    with open(os.path.join(run_dir, "flight_recorder", "trigger-worker_0.json")) as fh:
        marker = json.load(fh)
    assert marker["trigger"] == "nonfinite" and marker["global_step"] == 6
    assert marker["steps_written"] == [4, 5, 6] and marker["nonfinite_tensors"] == ["w"]
    trial = smd.create_trial(run_dir)
    # Scalars are written every step as usual; the kept steps replaced theirs with the whole step.
    assert trial.steps() == list(range(10))
    assert trial.tensor("w").steps() == [0, 4, 5, 6]
    assert [float(trial.tensor("w").reduction_value(s, "max")) for s in (0, 4, 5)] == [1 / 6, 1 / 2, 1.0]
    assert np.isinf(trial.tensor("w").reduction_value(6, "max"))
    assert [trial.tensor("scalar/loss").value(s).item() for s in range(10)] == list(range(10))
    assert "already published" not in caplog.text


def test_smdebug_ls_shows_the_trigger(tmp_path, capsys):
    from smdebug.analysis.cli import main

    run_dir = str(tmp_path / "run")
    _numpy_run(run_dir)
    assert main(["ls", run_dir]) == 0
    assert "flight recorder (worker_0): nonfinite at step 6 (w holds NaN or Inf at step 6); wrote steps [4, 5, 6]" \
        in capsys.readouterr().out


def test_a_step_larger_than_the_budget_is_not_kept(tmp_path, caplog):
    run_dir = str(tmp_path / "run")
    _numpy_run(run_dir, recorder=smd.FlightRecorder(steps=3, max_bytes=100, collections="default"))
    assert "more than max_bytes=100" in caplog.text
    with open(os.path.join(run_dir, "flight_recorder", "trigger-worker_0.json")) as fh:
        marker = json.load(fh)
    assert marker["steps_written"] == [] and marker["steps_too_large"] > 0
    assert smd.create_trial(run_dir).tensor("w").steps() == [0]


def test_dump_on_request_and_context_manager(tmp_path):
    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, include_regex=["w"], save_config=smd.SaveConfig(save_interval=100),
                    flight_recorder=smd.FlightRecorder(steps=2, collections="default"))
    for _ in range(4):
        hook.begin_step()
        hook.record("w", np.arange(3.0))
    hook.end_step()
    marker = hook.dump_flight_recorder("looked odd")
    assert marker["trigger"] == "manual" and marker["steps_written"] == [2, 3] and marker["global_step"] == 3
    assert hook.dump_flight_recorder("again") is None  # once per run
    hook.close()
    assert smd.create_trial(run_dir).flight_recorder_trigger()["reason"] == "looked odd"

    other = str(tmp_path / "other")
    with pytest.raises(KeyError):
        with smd.Hook(out_dir=other, include_regex=["w"], save_config=smd.SaveConfig(save_interval=100),
                      flight_recorder=smd.FlightRecorder(steps=2, collections="default")) as hook:
            for step in range(3):
                hook.begin_step()
                hook.record("w", np.arange(3.0))
            raise KeyError("lost")
    trial = smd.create_trial(other)
    found = trial.flight_recorder_trigger()
    assert found["trigger"] == "exception" and found["steps_written"] == [1, 2] and "KeyError" in found["reason"]
    assert trial.flight_recorder_triggers().keys() == {"worker_0"}


def test_no_recorder_no_marker(tmp_path):
    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, include_regex=["w"])
    hook.begin_step()
    hook.record("w", np.array([np.nan]))
    assert hook.dump_flight_recorder() is None and not hook.session.flight_recording
    hook.close()
    assert smd.create_trial(run_dir).flight_recorder_trigger() is None


def test_json_config_errors_name_the_key(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "run"),
                                  "HookParameters": {"flight_recorder": {"steps": "many"}}}))
    with pytest.raises(ConfigError, match=r"HookParameters.flight_recorder: flight_recorder steps must be"):
        smd.Hook.create_from_json_file(str(config))


def test_a_failing_recorder_costs_the_recorder_not_the_run(tmp_path, monkeypatch, caplog):
    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, include_regex=["w"], save_config=smd.SaveConfig(save_interval=100),
                    flight_recorder=smd.FlightRecorder(steps=2, collections="default"))

    def broken(*args):
        raise MemoryError("no room")

    monkeypatch.setattr(hook.session.recorder, "keep", broken)  # an injected fault: the recorder's own step store
    for step in range(4):
        hook.begin_step()
        hook.record("w", np.arange(3.0) + step)
    hook.close()
    assert hook.enabled and not hook.session.flight_recording
    assert "flight recorder disabled after an internal error (keeping step 1: MemoryError: no room)" in caplog.text
    # Step 1 was written rather than lost; afterwards the hook saves as configured.
    assert smd.create_trial(run_dir).tensor("w").steps() == [0, 1]


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_a_fire_from_another_thread_never_lands_between_keeping_a_step_and_writing_its_scalars(tmp_path, caplog):
    """A rule's dump (another thread) that comes while a kept step is being finished waits for
    its scalars to reach the writer: each step's scalar is filed once, none is dropped."""
    import threading

    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, include_regex=["w"], save_config=smd.SaveConfig(save_interval=100),
                    flight_recorder=smd.FlightRecorder(steps=3, collections="default"))
    recorder = hook.session.recorder
    keep, rule, fired = recorder.keep, [], []

    def keep_then_fire_elsewhere(identity, *args, **kwargs):
        keep(identity, *args, **kwargs)
        if identity[0] == 3:  # the dump runs on its own thread in the window it used to slip into
            rule.append(threading.Thread(target=lambda: fired.append(hook.dump_flight_recorder("rule", trigger="rule"))))
            rule[0].start()
            rule[0].join(0.5)  # it waits for the recorder's lock, held by this thread until the scalars are submitted

    recorder.keep = keep_then_fire_elsewhere
    for step in range(6):
        hook.begin_step()  # ends the previous step
        if rule:
            rule[0].join(30)
        hook.record("w", np.arange(3.0) + step)
        hook.save_scalar("loss", float(step))
    hook.close()
    assert fired[0]["trigger"] == "rule" and 3 in fired[0]["steps_written"]
    trial = smd.create_trial(run_dir)
    assert [trial.tensor("scalar/loss").value(s).item() for s in range(6)] == [float(s) for s in range(6)]
    assert trial.tensor("w").value(3).tolist() == [3.0, 4.0, 5.0]
    from smdebug.storage.format.codec import decode_tensor_event
    from smdebug.storage.format.records import iter_records

    names = []  # every tensor record of step 3's event file, by name
    for root, _, files in os.walk(os.path.join(run_dir, "events")):
        for name in files:
            if name.startswith("000000000003_"):
                with open(os.path.join(root, name), "rb") as fh:
                    names += [decode_tensor_event(bytes(payload)).tag for payload in iter_records(fh.read())]
    assert names.count("scalar/loss") == 1 and names.count("w") == 1
    assert "already published" not in caplog.text


def test_close_waits_for_a_dump_in_flight_on_another_thread(tmp_path, caplog):
    import threading

    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, include_regex=["w"], save_config=smd.SaveConfig(save_interval=100),
                    flight_recorder=smd.FlightRecorder(steps=2, collections="default"))
    for step in range(4):
        hook.begin_step()
        hook.record("w", np.arange(3.0) + step)
    hook.end_step()
    hook.flush()
    recorder, inside, markers = hook.session.recorder, threading.Event(), []

    def slow_dump():  # a rule's dump that is still writing when the training thread closes the hook
        with recorder.lock:
            inside.set()
            time.sleep(0.3)
            markers.append(recorder.fire("rule", "slow", (3, smd.modes.GLOBAL, 3)))

    rule = threading.Thread(target=slow_dump)
    rule.start()
    inside.wait(10)
    hook.close()
    rule.join(10)
    assert markers[0]["steps_written"] == [2, 3]
    assert smd.create_trial(run_dir).tensor("w").steps() == [0, 2, 3]
    assert "after close" not in caplog.text
    assert recorder.fire("rule", "too late", None) is None  # closed: nothing to write into

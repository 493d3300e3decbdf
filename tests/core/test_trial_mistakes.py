"""Reading mistakes (issue 21): wrong paths, unknown names, steps of another mode.

Runs are written by the real numpy Hook; every error must name the value and what to do.
"""
import logging
import threading
import time

import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import (
    MissingCollectionFiles,
    NoMoreData,
    RunNotFound,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.trials import create_trial


def write_run(out_dir, train_steps=4, eval_steps=2):
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.set_mode(smd.modes.TRAIN)
    for step in range(train_steps):
        hook.begin_step()
        hook.record("fc.weight", np.full(3, step, np.float32))
        hook.save_scalar("lr", 0.1)
    hook.set_mode(smd.modes.EVAL)
    for step in range(eval_steps):
        hook.begin_step()
        hook.record("loss", np.float32(step))
    hook.close()
    return str(out_dir)


def test_a_missing_path_fails_at_once_and_names_the_runs_nearby(tmp_path):
    write_run(tmp_path / "runs" / "exp1")
    write_run(tmp_path / "runs" / "exp2", 1, 0)
    started = time.monotonic()
    with pytest.raises(RunNotFound) as info:
        create_trial(str(tmp_path / "runs" / "exp3"))
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert "exp3 does not exist" in message and "runs found below" in message
    assert "exp1, exp2" in message and "pass wait_timeout" in message
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, MissingCollectionFiles)


def test_a_folder_of_runs_fails_at_once_and_lists_them(tmp_path):
    write_run(tmp_path / "runs" / "a" / "exp1", 1, 0)
    with pytest.raises(RunNotFound, match=r"is not a run directory.*runs found below .*runs: a/exp1"):
        create_trial(str(tmp_path / "runs"))


def test_a_file_is_not_a_run(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunNotFound, match="is a file, not a run directory"):
        create_trial(str(tmp_path / "f"))


def test_an_empty_directory_logs_once_that_it_waits(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        with pytest.raises(MissingCollectionFiles):
            create_trial(str(tmp_path), wait_timeout=0.6)
    waiting = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waiting) == 1 and "holds no run yet" in waiting[0] and "0.6 s" in waiting[0]


def test_an_explicit_wait_waits_for_the_directory_to_appear(tmp_path, caplog):
    run = tmp_path / "later"
    thread = threading.Thread(target=lambda: (time.sleep(0.3), write_run(run, 2, 0)))
    thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="smdebug"):
            trial = create_trial(str(run), wait_timeout=30)
        trial.wait_for_steps([1], timeout=30)
        assert trial.steps() == [0, 1]
        assert any("does not exist yet: waiting up to 30 s" in r.getMessage() for r in caplog.records)
    finally:
        thread.join()


def test_unknown_tensor_names_get_suggestions(tmp_path):
    trial = create_trial(write_run(tmp_path / "run"))
    with pytest.raises(TensorUnavailable, match=r"use trial.tensor\('scalar/lr'\)"):
        trial.tensor("lr")
    with pytest.raises(TensorUnavailable, match=r"did you mean 'fc.weight'\?"):
        trial.tensor("fc.wieght")
    with pytest.raises(TensorUnavailable, match=r"trial.tensor\('fc.weight'\).reduction_value\(step, 'max'\)"):
        trial.tensor("smdebug/reductions/max/fc.weight")
    with pytest.raises(TensorUnavailable, match=r"it has 3 tensors: trial.tensor_names\(\) lists them"):
        trial.tensor("completely_different")
    assert trial.tensor("scalar/lr").value(0) == pytest.approx(0.1)


def test_a_step_of_another_mode_says_which_mode_and_which_steps_exist(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", train_steps=4, eval_steps=6))
    # EVAL step 5 exists; TRAIN has steps 0-3 only.
    with pytest.raises(NoMoreData) as info:  # past TRAIN's last step
        trial.tensor("fc.weight").value(5, mode=smd.modes.TRAIN)
    message = str(info.value)
    assert "saved steps of mode TRAIN: 0, 1, 2, 3" in message
    assert "mode EVAL has a step 5 (global step 9): pass mode=smd.modes.EVAL" in message
    # The loss was saved in EVAL only: TRAIN step 1 exists, but not for this tensor.
    with pytest.raises(TensorUnavailableForStep) as info:
        trial.tensor("loss").value(1, mode=smd.modes.TRAIN)
    message = str(info.value)
    assert "steps of 'loss' in mode TRAIN: none" in message
    assert "mode EVAL has a step 1 (global step 5): pass mode=smd.modes.EVAL" in message
    # A global step asked for as a TRAIN step.
    with pytest.raises(NoMoreData, match=r"global step 9 is step 5 of mode EVAL: pass mode=smd.modes.GLOBAL"):
        trial.tensor("loss").value(9, mode=smd.modes.TRAIN)
    # A skipped step inside the range: StepUnavailable, with the steps that exist.
    hook = smd.Hook(out_dir=tmp_path / "gaps", save_config=smd.SaveConfig(save_interval=2), save_all=True)
    for _ in range(5):
        hook.begin_step()
        hook.record("w", np.ones(2))
    hook.close()
    with pytest.raises(StepUnavailable, match=r"step 1 of mode GLOBAL was not saved.*saved steps of mode GLOBAL: 0, 2, 4"):
        create_trial(str(tmp_path / "gaps")).tensor("w").value(1)


def test_a_mistyped_path_names_the_closest_runs_first(tmp_path):
    for name in ("bert_base", "vit_small", "resnet_lr001", "gpt_tiny"):
        write_run(tmp_path / "runs" / name, 1, 0)
    with pytest.raises(RunNotFound) as info:
        create_trial(str(tmp_path / "runs" / "resnet_lr01"))
    message = str(info.value)
    assert "runs found below" in message and "the closest first: resnet_lr001, " in message


def test_a_runs_tensorboard_folder_fails_at_once_naming_the_run(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1), export_tensorboard=True)
    hook.begin_step()
    hook.save_scalar("loss", 1.0)
    hook.close()
    started = time.monotonic()
    with pytest.raises(RunNotFound) as info:
        create_trial(str(tmp_path / "run" / "tensorboard"), wait_timeout=30)
    assert time.monotonic() - started < 5  # nothing to wait for
    message = str(info.value)
    assert "holds TensorBoard event files, not a run" in message and "tensorboard --logdir" in message
    assert f"the run is {tmp_path / 'run'}: open that" in message

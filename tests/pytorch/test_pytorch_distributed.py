"""Two real processes (gloo, DistributedDataParallel): workers, step completeness."""
import os
import socket
import time
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from smdebug.trials import create_trial  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dir_one, dir_all = str(base / "one"), str(base / "all")
    done = subprocess.run([sys.executable, SCRIPT, dir_one, dir_all, str(port)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return dir_one, dir_all


def test_include_workers_one_writes_rank_0_only(ddp_runs):
    trial = create_trial(ddp_runs[0])
    assert trial.workers() == ["worker_0"]
    assert trial.steps() == [0, 1]
    assert trial.tensor("Net_fc1.weight").workers(1) == ["worker_0"]
    assert "gradient/Net_fc1.weight" in trial.tensor_names()  # names unchanged by the DDP wrapper


def test_include_workers_all_writes_every_rank_and_steps_complete_when_both_did(ddp_runs):
    trial = create_trial(ddp_runs[1])
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    assert not trial.training_ended()
    # Steps 3 and 4 were written by worker_0 only: not complete while training goes on.
    assert trial.steps() == [0, 1, 2]
    assert trial.steps(show_incomplete_steps=True) == [0, 1, 2, 3, 4]
    grads = trial.tensor("gradient/Net_fc1.weight")
    assert sorted(grads.workers(2)) == ["worker_0", "worker_1"]
    # DDP averages gradients across ranks: both workers saved the same values.
    np.testing.assert_allclose(grads.value(2, worker="worker_0"), grads.value(2, worker="worker_1"), rtol=1e-6)
    # Each rank saw its own data: the losses differ.
    loss = trial.tensor("CrossEntropyLoss_output_0")
    assert loss.value(0, worker="worker_0") != loss.value(0, worker="worker_1")

    open(os.path.join(ddp_runs[1], "training_job_end.ts"), "w").close()
    ended = create_trial(ddp_runs[1])
    assert ended.steps() == [0, 1, 2, 3, 4]
    assert [ended.mode(s).name for s in ended.steps()] == ["TRAIN"] * 3 + ["EVAL"] * 2


# ----------------------------------------------------------------------------- workers not in lockstep
EARLY_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_worker.py")


def start_worker(rank, *args):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
    env.pop("MASTER_ADDR", None)
    return subprocess.Popen([sys.executable, EARLY_WORKER, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(path, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_chief_starting_after_another_worker_wrote_steps_joins_the_run(tmp_path):
    run = tmp_path / "run"
    worker_1 = start_worker(1, run, 2, tmp_path / "worker_1_wrote", tmp_path / "chief_wrote")
    try:
        wait_for_file(tmp_path / "worker_1_wrote", worker_1)  # worker 1's steps are on disk
        assert os.listdir(run / "store" / "live" / "worker=worker_1")  # its steps, in its live segment
        chief = start_worker(0, run, 3, tmp_path / "chief_wrote")
        _, chief_err = chief.communicate(timeout=120)
        _, worker_err = worker_1.communicate(timeout=120)
    finally:
        for proc in (worker_1,):
            if proc.poll() is None:
                proc.kill()
    assert chief.returncode == 0, chief_err[-3000:]
    assert worker_1.returncode == 0, worker_err[-3000:]
    trial = create_trial(str(run), wait_timeout=5)
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1, 2]
    x = trial.tensor("x")
    assert x.value(1, worker="worker_0").tolist() == [1.0, 1.0]
    assert x.value(1, worker="worker_1").tolist() == [11.0, 11.0]


def _previous_run(out_dir, monkeypatch):
    """A finished single-worker run of tensor "old" (steps 0-4) at ``out_dir``."""
    import smdebug.pytorch as smd

    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1))
    for _ in range(5):
        hook.begin_step()
        hook.save_tensor("old", torch.zeros(2), "mine")
    hook.close()


def _join_with_overwrite(run, tmp_path, wait_for_step_of_worker_1):
    """Both ranks start together; worker 1 writes its steps first, and only then does the
    chief, started with it, make its hook with overwrite=True."""
    time.sleep(1.1)  # S3 keeps modification times to the second: the old run is older than the job
    go = tmp_path / "chief_may_start"
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", EARLY_WORKER_OVERWRITE="1", EARLY_WORKER_HOOK_AFTER=str(go))
    env.pop("MASTER_ADDR", None)
    chief = subprocess.Popen([sys.executable, EARLY_WORKER, str(run), "3", str(tmp_path / "chief_wrote")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker_1 = start_worker(1, run, 2, tmp_path / "worker_1_wrote", tmp_path / "chief_wrote")
    try:
        wait_for_file(tmp_path / "worker_1_wrote", worker_1)
        wait_for_step_of_worker_1()
        go.touch()
        _, chief_err = chief.communicate(timeout=120)
        _, worker_err = worker_1.communicate(timeout=120)
    finally:
        for proc in (chief, worker_1):
            if proc.poll() is None:
                proc.kill()
    assert chief.returncode == 0, chief_err[-3000:]
    assert worker_1.returncode == 0, worker_err[-3000:]


def _check_new_run_only(trial):
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor_names() == ["x"]  # nothing of the previous run is left
    assert trial.tensor("x").value(1, worker="worker_1").tolist() == [11.0, 11.0]
    assert trial.tensor("x").value(2, worker="worker_0").tolist() == [2.0, 2.0]


def test_overwrite_removes_the_previous_run_but_not_a_worker_that_started_first(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _previous_run(str(run), monkeypatch)
    _join_with_overwrite(run, tmp_path, lambda: None)
    _check_new_run_only(create_trial(str(run), wait_timeout=5))


def test_overwrite_on_s3_keeps_what_a_worker_of_this_job_uploaded_first(tmp_path, monkeypatch):
    """The same on an S3 prefix (moto's server on loopback): worker 1's steps are uploaded
    before the chief, with overwrite=True, removes the previous run there."""
    pytest.importorskip("moto.server", reason="needs moto[server]")
    pytest.importorskip("s3fs")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
    from s3_endpoint import serve

    endpoint = serve(monkeypatch, tmp_path, "jobs")
    s3 = endpoint.client()
    try:
        url = "s3://jobs/run"
        _previous_run(url, monkeypatch)

        def worker_1_uploaded():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                prefix = "run/store/statistics/worker=worker_1/"  # its flush sealed its segment
                if s3.list_objects_v2(Bucket="jobs", Prefix=prefix).get("Contents"):
                    return
                time.sleep(0.1)
            raise AssertionError("worker 1's segment was not uploaded")

        _join_with_overwrite(url, tmp_path, worker_1_uploaded)
        _check_new_run_only(create_trial(url, wait_timeout=5))
    finally:
        endpoint.stop()


def test_a_previous_run_is_still_refused_by_the_chief_of_a_multi_worker_job(tmp_path, monkeypatch):
    import smdebug.pytorch as smd
    from smdebug.exceptions import OutDirError

    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, end in ((1, True), (0, False)):  # another rank's ended run; this rank's own files
        run = tmp_path / f"run_{rank}_{end}"
        monkeypatch.setenv("RANK", str(rank))
        hook = smd.Hook(out_dir=str(run), include_workers="all", save_config=smd.SaveConfig(save_interval=1))
        hook.begin_step()
        hook.save_tensor("x", torch.ones(2), "mine")
        hook.end_step()
        hook.session.writer.flush()
        if end:
            hook.close()
            open(run / "training_job_end.ts", "w").close()
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(OutDirError, match="already holds a run"):
            smd.Hook(out_dir=str(run), include_workers="all")
        if not end:
            hook.close()

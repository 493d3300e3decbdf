"""Two real processes (gloo, DistributedDataParallel): workers, step completeness."""
import os
import socket
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

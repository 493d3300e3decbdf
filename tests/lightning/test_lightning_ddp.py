"""Lightning's DDP strategy (two CPU processes, gloo): worker names and include_workers."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from smdebug.trials import create_trial

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")


def run_ddp(tmp_path, include_workers, *extra):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDEBUG_")}
    env.update(PL_DISABLE_FORK="1", OMP_NUM_THREADS="1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    done = subprocess.run([sys.executable, SCRIPT, str(out), include_workers, *extra], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / f"report_{rank}.json").read_text()) for rank in (0, 1)]
    return str(out), reports


@pytest.mark.timeout(300)
def test_each_rank_writes_as_its_worker(tmp_path):
    out, reports = run_ddp(tmp_path, "all")
    assert sorted((r["rank"], r["worker"], r["global_step"]) for r in reports) == [
        (0, "worker_0", 2), (1, "worker_1", 2)]  # 8 batches / 2 ranks / 2 accumulated = 2 steps each
    trial = create_trial(out)
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1]
    grad = trial.tensor("gradient/TinyModule_net.0.weight")
    # DDP averages gradients across ranks: both workers saved the same accumulated gradient.
    for step in (0, 1):
        np.testing.assert_allclose(grad.value(step, worker="worker_0"), grad.value(step, worker="worker_1"),
                                   rtol=1e-6)


@pytest.mark.timeout(300)
def test_by_default_only_the_chief_writes(tmp_path):
    out, reports = run_ddp(tmp_path, "one")
    assert sorted(r["worker"] for r in reports) == ["worker_0", "worker_1"]
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"]
    assert trial.steps() == [0, 1]


@pytest.mark.timeout(300)
def test_a_stop_asked_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    # Rank 0 alone asks at optimizer step 2 (a rule firing on its loss, say): a rank that
    # stopped alone would leave the other in its next gradient all-reduce.
    out, reports = run_ddp(tmp_path, "all", "2")
    steps = sorted(r["global_step"] for r in reports)
    assert steps[0] == steps[1] and 2 < steps[0] < 12, reports  # 48 batches / 2 ranks / 2 accumulated = 12

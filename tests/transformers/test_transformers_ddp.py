"""The Trainer under torchrun (two CPU processes, gloo, accelerate underneath): worker names."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from smdebug.trials import create_trial

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")


@pytest.mark.timeout(300)
def test_each_rank_writes_as_its_worker(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDEBUG_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    port = str(29600 + os.getpid() % 1000)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", port, SCRIPT, str(out)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / f"report_{rank}.json").read_text()) for rank in (0, 1)]
    # 32 samples, batches of 4 on each of 2 ranks, 2 per optimizer step: 2 steps
    assert sorted((r["rank"], r["worker"], r["global_step"]) for r in reports) == [
        (0, "worker_0", 2), (1, "worker_1", 2)]
    trial = create_trial(str(out))
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1]
    grad = trial.tensor("gradient/BertForSequenceClassification_classifier.weight")
    for step in (0, 1):  # DDP averaged the gradients: both ranks saved the same
        np.testing.assert_allclose(grad.value(step, worker="worker_0"), grad.value(step, worker="worker_1"),
                                   rtol=1e-5)

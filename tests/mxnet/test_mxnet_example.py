"""The Gluon example runs end to end in its own process and writes a readable run."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("mxnet")

from smdebug.trials import create_trial

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mxnet", "train_gluon.py")


def test_example_trains_and_reports(run_dir):
    done = subprocess.run([sys.executable, EXAMPLE, "--out-dir", run_dir, "--epochs", "1", "--interval", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "validation accuracy" in done.stdout and "dense0_weight l2 norm" in done.stdout
    trial = create_trial(run_dir)
    assert trial.training_ended()
    assert trial.steps(mode="TRAIN") == [0, 5, 10, 15, 20]
    assert "gradient/dense1_weight" in trial.tensor_names(collection="gradients")
    assert set(trial.tensor("dense0_weight").reduction_values(0, mode="TRAIN")) == {("mean", False), ("l2", False)}

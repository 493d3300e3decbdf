"""The Keras example runs end to end in its own process and writes a readable run."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from smdebug.trials import create_trial

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tensorflow", "train_keras.py")


def test_example_trains_and_reports(tmp_path):
    out_dir = str(tmp_path / "run")
    done = subprocess.run([sys.executable, EXAMPLE, "--out-dir", out_dir, "--epochs", "1", "--interval", "5"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "TRAIN loss" in done.stdout and "|hidden kernel|" in done.stdout, done.stdout
    trial = create_trial(out_dir)
    assert trial.training_ended()
    # 1,600 training points in batches of 64: 25 TRAIN steps, losses at each one.
    assert trial.tensor("loss").steps(mode="TRAIN") == list(range(25))
    assert trial.tensor("hidden/weights/planes/hidden/kernel").steps(mode="TRAIN") == [0, 5, 10, 15, 20]
    assert "gradients/planes/hidden/kernelGrad" in trial.tensor_names(collection="gradients")
    assert trial.steps(mode="EVAL")  # validation and evaluate()
    assert os.listdir(os.path.join(out_dir, "tensorboard"))

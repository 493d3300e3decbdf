"""The report of a real Keras run (the Keras example), rendered in headless chromium."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("matplotlib")

from smdebug.analysis.cli import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support"))
from report_checks import assert_not_blank, check_report, render, section

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tensorflow", "train_keras.py")


def test_report_of_a_keras_run(tmp_path):
    run = str(tmp_path / "run")
    done = subprocess.run([sys.executable, EXAMPLE, "--out-dir", run, "--epochs", "1", "--interval", "5"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "report.html")
    assert main(["report", run, "-o", out, "--rules-budget", "0"]) == 0
    text = check_report(out)
    assert "<th>framework</th><td>TensorFlow</td>" in section(text, "summary")
    assert "<img" in section(text, "curves") and "loss" in section(text, "curves")
    heat = section(text, "heatmaps")
    assert "<h3>gradients</h3>" in heat and "<h3>weights</h3>" in heat and "<h3>biases</h3>" in heat
    assert "<img" in section(text, "distributions")
    console, pixels = render(out, tmp_path)
    assert console == []
    assert_not_blank(pixels)

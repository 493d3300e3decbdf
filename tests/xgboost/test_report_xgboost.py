"""The report of a real XGBoost run (the XGBoost example): metrics as curves, trees and
feature importance in heatmaps, the XGBoost rules; rendered in headless chromium."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("xgboost")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from smdebug.analysis.cli import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support"))
from report_checks import assert_not_blank, check_report, render, section

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "xgboost", "train_classifier.py")


def test_report_of_an_xgboost_run(tmp_path):
    run = str(tmp_path / "run")
    done = subprocess.run([sys.executable, EXAMPLE, "--out-dir", run, "--rounds", "20"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "report.html")
    assert main(["report", run, "-o", out, "--rules-budget", "0"]) == 0
    text = check_report(out)
    assert "<th>framework</th><td>XGBoost</td>" in section(text, "summary")
    curves = section(text, "curves")
    for title in ("losses over", "metrics over", "feature_importance heatmap"):
        assert f'alt="{title}' in curves
    assert "GLOBAL 5" in section(text, "summary")  # saved every 5 rounds (XGBoost steps have no mode)
    assert "TreeDepth" in section(text, "findings")
    console, pixels = render(out, tmp_path)
    assert console == []
    assert_not_blank(pixels)

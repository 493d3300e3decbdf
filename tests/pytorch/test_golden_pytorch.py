"""The files of a fixed-seed pytorch run are those recorded in tests/golden/pytorch.json.

Guards restructurings of the capture path: same files, same records in the same order,
bit for bit (timestamps aside); reduction values to a relative 1e-6 (tests/golden/golden_runs.py).
"""
import os
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden"))

import golden_runs


def test_pytorch_run_writes_the_golden_files(tmp_path):
    assert golden_runs.check("pytorch", str(tmp_path / "run")) == []


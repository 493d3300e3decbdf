"""The files of a fixed-seed numpy run are those recorded in tests/golden/numpy.json.

Guards restructurings of the capture path: same files, same records in the same order,
bit for bit (timestamps aside); reduction values to a relative 1e-6 (tests/golden/golden_runs.py).
"""
import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden"))

import golden_runs


def test_numpy_run_writes_the_golden_files(tmp_path):
    assert golden_runs.check("numpy", str(tmp_path / "run")) == []


def test_numpy_run_writes_the_golden_run_store(tmp_path):
    """The same run in the run store (docs/format.md 10): the same rows, records and files."""
    assert golden_runs.check("numpy", str(tmp_path / "run"), layout="store") == []

"""The files of a fixed-seed pytorch run are those recorded in tests/golden/pytorch.json.

Guards restructurings of the capture path: same files, same records in the same order,
bit for bit (timestamps aside); reduction values to a relative 1e-6 (tests/golden/golden_runs.py).
"""
import json
import os
import sys

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
sys.path.insert(0, GOLDEN_DIR)

import golden_runs  # noqa: E402


def test_pytorch_run_writes_the_golden_files(tmp_path):
    out_dir = str(tmp_path / "run")
    golden_runs.RUNS["pytorch"](out_dir)
    with open(os.path.join(GOLDEN_DIR, "pytorch.json")) as handle:
        expected = json.load(handle)
    assert golden_runs.compare(expected, golden_runs.digest(out_dir)) == []

"""benchmarks/gpu_check.sh at smoke size on the CPU: the GPU check cannot rot between the
runs on a machine with a device (its figures are not checked here, only that every part runs)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_runs_at_smoke_size():
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), "--smoke"],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for part in ("== 1. CUDA tests", "== 2. overhead table", "== 3. FSDP2", "== gpu_check: done"):
        assert part in out
    table = [line for line in out.splitlines() if "@0.02" in line or "@0.05" in line]
    assert len(table) == 6, out  # three rows under each budget, each saying the interval it chose
    assert all("every " in line for line in table), out

"""Helpers of the packaging tests: each builds or installs into a fresh venv."""
import subprocess

import pytest


def run_checked(*cmd, **kwargs) -> str:
    """Run ``cmd``; its stdout. Fails the test with the end of stderr if it fails."""
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture
def run():
    return run_checked

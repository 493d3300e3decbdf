"""Fixtures of the PyTorch adapter tests (helpers are in pt_helpers.py)."""
import pytest


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")

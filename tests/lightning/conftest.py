"""The Lightning tests need PyTorch Lightning (tox env ``lightning``); elsewhere they are skipped."""
import importlib.util
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # lightning_helpers


def _load_shared_helpers():
    """tests/trainer_helpers.py, shared with the other trainer folder, as ``trainer_helpers``.

    Loaded by path: putting tests/ itself on sys.path would make its framework-named
    folders (tests/tensorflow, tests/mxnet) importable as those frameworks.
    """
    path = os.path.join(os.path.dirname(HERE), "trainer_helpers.py")
    spec = importlib.util.spec_from_file_location("trainer_helpers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["trainer_helpers"] = module
    spec.loader.exec_module(module)


_load_shared_helpers()

"""The Lightning tests need PyTorch Lightning (tox env ``lightning``); elsewhere they are skipped."""
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

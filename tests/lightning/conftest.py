"""The Lightning tests need PyTorch Lightning (tox env ``lightning``); elsewhere they are skipped."""
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # lightning_helpers, trainer_helpers

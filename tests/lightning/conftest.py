"""The Lightning tests need PyTorch Lightning (tox env ``lightning``); elsewhere they are skipped."""
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # lightning_helpers
# trainer_helpers, shared with the other trainer folder (tests/support, not tests/: its
# framework-named folders would shadow the frameworks)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))

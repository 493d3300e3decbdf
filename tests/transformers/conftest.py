"""The Transformers tests need transformers and accelerate (tox env ``transformers``); elsewhere skipped.
Nothing is downloaded: models are built from configs with random weights."""
import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # hf_helpers
# trainer_helpers, shared with the other trainer folder (tests/support, not tests/: its
# framework-named folders would shadow the frameworks)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))

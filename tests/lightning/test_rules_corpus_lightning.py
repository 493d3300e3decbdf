"""The built-in rules on the rules corpus's Lightning run (tests/support/rules_corpus.py).

The default ``smdebug rules`` exits 0 on a healthy Lightning fit (DebuggerCallback).
"""
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
pytest.importorskip("smdebug.lightning")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import rules_corpus

globals().update(rules_corpus.framework_tests("lightning"))  # corpus, and the healthy and broken runs' tests

"""The built-in rules on the rules corpus's Keras run (tests/support/rules_corpus.py).

The default ``smdebug rules`` exits 0 on the healthy Keras fits (with validation data; with
EarlyStopping) and the intended rules fire on the broken one (a patience far past the best).
"""
import os
import sys

import pytest

pytest.importorskip("keras")
pytest.importorskip("smdebug.tensorflow")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import rules_corpus

globals().update(rules_corpus.framework_tests("keras"))  # corpus, and the healthy and broken runs' tests

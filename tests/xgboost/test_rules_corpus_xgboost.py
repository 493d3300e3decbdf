"""The built-in rules on the rules corpus's XGBoost runs (tests/support/rules_corpus.py).

The default ``smdebug rules`` exits 0 on the healthy classifier (XGBoost's defaults) and
each rule fires on the broken runs meant for it, at the injected fault's step where it has one.
"""
import os
import sys

import pytest

pytest.importorskip("xgboost")
pytest.importorskip("smdebug.xgboost")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import rules_corpus

globals().update(rules_corpus.framework_tests("xgboost"))  # corpus, and the healthy and broken runs' tests

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

FRAMEWORK = "lightning"
corpus = rules_corpus.corpus_fixture(FRAMEWORK)


@pytest.mark.parametrize("name", rules_corpus.healthy_runs(FRAMEWORK))
def test_default_rules_are_silent_on_a_healthy_run(corpus, name):
    assert rules_corpus.noise(corpus[name]) is None


@pytest.mark.parametrize("name,rule", rules_corpus.broken_cases(FRAMEWORK))
def test_each_rule_fires_on_its_broken_runs(corpus, name, rule):
    assert rules_corpus.misses(corpus[name], name, rule) == []

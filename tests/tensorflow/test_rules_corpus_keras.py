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

FRAMEWORK = "keras"
corpus = rules_corpus.corpus_fixture(FRAMEWORK)


@pytest.mark.parametrize("name", rules_corpus.healthy_runs(FRAMEWORK))
def test_default_rules_are_silent_on_a_healthy_run(corpus, name):
    assert rules_corpus.noise(corpus[name]) is None


@pytest.mark.parametrize("name,rule", rules_corpus.broken_cases(FRAMEWORK))
def test_each_rule_fires_on_its_broken_runs(corpus, name, rule):
    assert rules_corpus.misses(corpus[name], name, rule) == []

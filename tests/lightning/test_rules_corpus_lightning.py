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
HEALTHY = rules_corpus.healthy_runs(FRAMEWORK)
BROKEN = rules_corpus.broken_cases(FRAMEWORK)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every Lightning run of the corpus, built once for this module."""
    return rules_corpus.build_all(FRAMEWORK, str(tmp_path_factory.mktemp("rules_corpus")))


@pytest.mark.parametrize("name", HEALTHY)
def test_default_rules_are_silent_on_a_healthy_run(corpus, name):
    rules_corpus.assert_silent(corpus[name])


@pytest.mark.parametrize("name,rule", BROKEN, ids=[f"{n}-{r}" for n, r in BROKEN])
def test_each_rule_fires_on_its_broken_runs(corpus, name, rule):
    rules_corpus.assert_caught(corpus[name], name, rule)

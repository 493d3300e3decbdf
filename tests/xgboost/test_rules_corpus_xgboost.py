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
from smdebug.analysis.rules.builtin import BUILTIN_RULES

FRAMEWORK = "xgboost"
HEALTHY = [n for n in rules_corpus.run_names(FRAMEWORK) if rules_corpus.label_of(n).healthy]
BROKEN = [(n, r) for n in rules_corpus.run_names(FRAMEWORK) for r in rules_corpus.label_of(n).rules
          if r in BUILTIN_RULES]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every XGBoost run of the corpus, built once for this module."""
    root = str(tmp_path_factory.mktemp("rules_corpus"))
    return {name: rules_corpus.build(name, root) for name in rules_corpus.run_names(FRAMEWORK)}


@pytest.mark.parametrize("name", HEALTHY)
def test_default_rules_are_silent_on_a_healthy_run(corpus, name):
    status, output = rules_corpus.default_rules(corpus[name])
    assert status == 0, output
    assert "FIRED" not in output


@pytest.mark.parametrize("name,rule", BROKEN, ids=[f"{n}-{r}" for n, r in BROKEN])
def test_each_rule_fires_on_its_broken_runs(corpus, name, rule):
    report = rules_corpus.evaluate(corpus[name], rule)
    assert report.triggered > 0, report
    label = rules_corpus.label_of(name)
    first = report.to_dict()["violations"][0]
    if label.fault_step is not None:  # caught within a step or two of the injected fault
        assert abs(first["step"] - label.fault_step) <= 2, report.violation_steps[:5]
    if label.culprit is not None and rule in label.culprit_rules:  # and the finding names where it started
        named = first["details"]["culprit"]
        assert named["layer"] == label.culprit, named
        assert label.fault_step is None or abs(named["first_step"] - label.fault_step) <= 2, named
    status, output = rules_corpus.default_rules(corpus[name])
    assert status == 1 and any(line.startswith(rule) and "FIRED" in line for line in output.splitlines()), output

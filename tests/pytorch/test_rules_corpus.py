"""The built-in rules on the rules corpus's PyTorch runs (tests/support/rules_corpus.py).

The default ``smdebug rules`` exits 0 on every healthy run (the README example's included) and
each rule fires on the broken runs meant for it, at the injected fault's step where it has one.
"""
import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("smdebug.pytorch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import rules_corpus
from smdebug.analysis.rules.builtin import BUILTIN_RULES

FRAMEWORK = "pytorch"
HEALTHY = [n for n in rules_corpus.run_names(FRAMEWORK) if rules_corpus.label_of(n).healthy]
BROKEN = [(n, r) for n in rules_corpus.run_names(FRAMEWORK) for r in rules_corpus.label_of(n).rules
          if r in BUILTIN_RULES]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every PyTorch run of the corpus, built once for this module."""
    root = str(tmp_path_factory.mktemp("rules_corpus"))
    return {name: rules_corpus.build(name, root) for name in rules_corpus.run_names(FRAMEWORK)}


def test_the_corpus_has_what_the_issue_asks():
    labels = [rules_corpus.label_of(n) for n in rules_corpus.run_names()]
    assert sum(label.healthy for label in labels) >= 8
    assert sum(not label.healthy for label in labels) >= 12
    assert all(label.rules for label in labels if not label.healthy)
    assert "pt_readme_example" in HEALTHY


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
    if label.fault_step is not None:
        assert abs(report.violation_steps[0] - label.fault_step) <= 2, report.violation_steps[:5]
    status, output = rules_corpus.default_rules(corpus[name])
    assert status == 1 and any(line.startswith(rule) and "FIRED" in line for line in output.splitlines()), output

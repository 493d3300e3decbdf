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

FRAMEWORK = "pytorch"
corpus = rules_corpus.corpus_fixture(FRAMEWORK)


@pytest.mark.parametrize("name", rules_corpus.healthy_runs(FRAMEWORK))
def test_default_rules_are_silent_on_a_healthy_run(corpus, name):
    assert rules_corpus.noise(corpus[name]) is None


@pytest.mark.parametrize("name,rule", rules_corpus.broken_cases(FRAMEWORK))
def test_each_rule_fires_on_its_broken_runs(corpus, name, rule):
    assert rules_corpus.misses(corpus[name], name, rule) == []


def test_the_corpus_has_what_the_issue_asks():
    labels = [rules_corpus.label_of(n) for n in rules_corpus.run_names()]
    assert sum(label.healthy for label in labels) >= 8
    assert sum(not label.healthy for label in labels) >= 12
    assert all(label.rules for label in labels if not label.healthy)
    assert {"pt_readme_example", "pt_training_health"} <= set(rules_corpus.healthy_runs("pytorch"))


def test_a_run_with_optimizer_state_is_still_told_a_pytorch_run(corpus):
    from smdebug.analysis.rules.builtin import RunContents
    from smdebug.trials import create_trial

    assert RunContents(create_trial(corpus["pt_training_health"])).framework == "PyTorch"



@pytest.mark.parametrize("name", ["pt_tanh_step_decay", "pt_sgd_batch8_500"])
def test_the_issues_loss_false_alarms_are_gone(corpus, name):
    """Issue 45's two healthy runs: a loss that rises while Adam and its schedule settle, and a
    batch-8 loss whose downward trend hides in its noise. SageMaker's point comparison (the
    rule as user code constructs it) fires early; the default set waits out the warm-up and
    judges the trend against the noise."""
    from smdebug.rules import LossNotDecreasing, invoke_rule
    from smdebug.trials import create_trial

    reference = invoke_rule(LossNotDecreasing(create_trial(corpus[name])), report_path=None)
    assert reference.triggered and reference.violation_steps[0] <= 40, reference.violation_steps
    assert rules_corpus.evaluate(corpus[name], "LossNotDecreasing").triggered == 0



def test_loss_spike_live_dumps_the_flight_recorder(tmp_path):
    """Live, LossSpike's action fires the flight recorder, naming the rule, the step and the
    layer that moved first (weights and gradients saved every 100 steps, the loss every step)."""
    import torch

    import smdebug.pytorch as smd
    from smdebug.trials import create_trial

    model, data, loss_fn = rules_corpus._mlp(), rules_corpus._Data(), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=100),
                    include_collections=["weights", "gradients", "losses"],
                    flight_recorder=smd.FlightRecorder(steps=6, collections=["weights", "gradients"]))
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    from smdebug.rules import LossSpike

    evaluator = hook.add_rule(LossSpike())
    for step in range(170):
        x, y = data.batch(32)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == 150:
            model.fc2.weight.grad.mul_(30000.0)
        opt.step()
    hook.close()
    evaluator.wait()
    marker = create_trial(str(tmp_path / "run")).flight_recorder_trigger()
    assert marker is not None and marker["trigger"] == "rule" and "LossSpike" in marker["reason"]
    # The rule runs beside training (one step of lag allowed): the recorder fires at 151 or 152.
    assert "fired at step 151" in marker["reason"] and "fc2 moved first" in marker["reason"]
    assert marker["global_step"] in (151, 152)
    assert 150 in marker["steps_written"] + marker["steps_already_saved"]


def test_vanishing_gradient_reads_the_readme_examples_l2_norms_at_every_train_step(corpus):
    """The README example saves whole gradients every 50 TRAIN steps and their L2 norm at every
    step: VanishingGradient judges the 294 others by their RMS (issue 45: it read 6 of 300)."""
    from smdebug.modes import ModeKeys
    from smdebug.trials import create_trial

    run = corpus["pt_readme_example"]
    train_steps = create_trial(run).steps(mode=ModeKeys.TRAIN)
    assert len(train_steps) == 300
    report = rules_corpus.evaluate(run, "VanishingGradient").to_dict()
    assert report["steps_without_data_by_mode"] == {"EVAL": 9}, report  # EVAL steps save no gradients
    status, output = rules_corpus.default_rules(run)
    assert "VanishingGradient  did not fire: 300 of 309 steps evaluated" in output, output

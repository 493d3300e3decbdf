"""Rules that settle a step from the bulk columns (``Rule.settle_step``) report exactly what
evaluating the step tensor by tensor reports: the same firings, steps, messages and counts."""
import numpy as np
import pytest

import smdebug as smd
from smdebug.analysis.rules.rule import Rule, run_rules
from smdebug.rules import ExplodingTensor, LossNotDecreasing, LossSpike, VanishingGradient, WeightUpdateRatio
from smdebug.trials import create_trial

_TIME_FIELDS = ("time", "elapsed", "seconds", "started", "updated", "written", "duration")


def _write_run(out_dir, whole_weights_every=0, steps=120, l2_only=False, l2_shapes=False, whole_gradients_every=0):
    """4 layers saved as reductions (whole weights every ``whole_weights_every`` steps when
    set; with ``l2_only`` only L2 norms, with their shapes if ``l2_shapes``; the gradients
    also whole every ``whole_gradients_every`` steps when set); a NaN gradient at steps 30-31,
    tiny gradients at 50-59 and 90, a loss spike at 70."""
    rng = np.random.default_rng(3)
    reductions = smd.ReductionConfig(norms=["l2"], save_shape=l2_shapes) if l2_only else \
        smd.ReductionConfig(reductions=["min", "max", "mean"], abs_reductions=["mean"], norms=["l2"])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "weights", "losses"] + (["whole_gradients"] if whole_gradients_every
                                                                              else []),
                    reduction_config=reductions)
    hook.get_collection("losses").include("^loss$")
    if whole_gradients_every:  # as the README example: values at intervals, L2 norms at every step
        whole = hook.get_collection("whole_gradients")
        whole.include("^gradient/")
        whole.reduction_config = smd.ReductionConfig(save_raw_tensor=True)
        whole.save_config = smd.SaveConfig(save_interval=whole_gradients_every)
    if whole_weights_every:
        weights_collection = hook.get_collection("weights")
        weights_collection.reduction_config = smd.ReductionConfig(save_raw_tensor=True)
        weights_collection.save_config = smd.SaveConfig(save_interval=whole_weights_every)
    weights = [rng.standard_normal(8).astype(np.float32) for _ in range(4)]
    for step in range(steps):
        hook.begin_step()
        for i in range(4):
            grad = rng.standard_normal(8).astype(np.float32) * 0.01
            if step in (30, 31) and i == 2:
                grad[1] = np.nan
            if (50 <= step < 60 or step == 90) and i in (0, 3):
                grad *= 1e-9
            hook.record(f"gradient/layer{i}.weight", grad)
            hook.record(f"layer{i}.weight", weights[i])
            weights[i] = weights[i] - 1e-3 * np.nan_to_num(grad)
        loss = 1.0 / (1 + 0.02 * step) + 0.01 * rng.standard_normal() + (5.0 if step == 70 else 0.0)
        hook.record("loss", np.float32(loss))
    hook.close()
    return out_dir


def _reports(run_dir):
    trial = create_trial(run_dir, progress=False)
    rules = [VanishingGradient(trial), ExplodingTensor(trial), LossNotDecreasing(trial), WeightUpdateRatio(trial),
             LossSpike(trial)]
    run_rules(rules, follow=False)
    return {rule.rule_name: _without_times(rule.report.to_dict()) for rule in rules}


def _without_times(doc):
    if isinstance(doc, dict):
        return {k: _without_times(v) for k, v in doc.items() if not any(t in k for t in _TIME_FIELDS)}
    if isinstance(doc, list):
        return [_without_times(v) for v in doc]
    return doc


@pytest.mark.parametrize("whole_weights_every, l2_only, l2_shapes, whole_gradients_every",
                         [(0, False, False, 0), (1, False, False, 0), (7, False, False, 0), (0, True, False, 0),
                          (7, True, False, 0), (7, True, True, 0), (0, True, False, 10), (0, True, True, 10)])
def test_settled_steps_report_what_step_by_step_evaluation_reports(tmp_path, monkeypatch, whole_weights_every,
                                                                   l2_only, l2_shapes, whole_gradients_every):
    run_dir = _write_run(str(tmp_path / "run"), whole_weights_every, l2_only=l2_only, l2_shapes=l2_shapes,
                         whole_gradients_every=whole_gradients_every)
    settled = _reports(run_dir)
    monkeypatch.setattr(Rule, "_settle", lambda self, view, columns: False)
    step_by_step = _reports(run_dir)
    assert settled == step_by_step
    # The run has something for each shortcut to decline: the comparison covers firings too.
    assert settled["ExplodingTensor"]["violations"]
    if l2_only and not (l2_shapes or whole_gradients_every or whole_weights_every):  # no element counts: nothing to judge
        assert settled["VanishingGradient"]["datapoints"] == 0 and settled["VanishingGradient"]["steps_without_data"]
    else:  # judged by their abs mean, their values, or the RMS of their L2 norms
        assert settled["VanishingGradient"]["violations"]

"""Every built-in rule on real runs written by the numpy hook: one run that must fire it, one that must not.

Where a rule can work from saved reductions instead of full tensors, both kinds of run are
tested. Framework-specific runs (sigmoid stacks, XGBoost trees) are in the framework folders.
"""
import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError
from smdebug.rules import (
    AllZero, ClassImbalance, DeadRelu, ExplodingTensor, FeatureImportanceOverweight, LossNotDecreasing, LossSpike,
    Overfit,
    Overtraining, PoorWeightInitialization, SaturatedActivation, SimilarAcrossRuns, TensorVariance, TreeDepth,
    UnchangedTensor, VanishingGradient, WeightUpdateRatio, invoke_rule,
)
from smdebug.trials import create_trial

RAW = smd.ReductionConfig(save_raw_tensor=True)
rng = np.random.default_rng(0)


def make_run(tmp_path, record, steps, *, reductions=None, modes=None, name="run", collections=("gradients",
                                                                                                 "weights")):
    """Write a run with the numpy hook (every step saved) and open it. ``modes``: [(mode, n_steps), ...]."""
    hook = smd.Hook(out_dir=str(tmp_path / name), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=list(collections), reduction_config=reductions or RAW)
    plan = modes or [(smd.modes.GLOBAL, steps)]
    for mode, n in plan:
        hook.set_mode(mode)
        for _ in range(n):
            hook.begin_step()
            record(hook, hook.global_step, mode)
    hook.close()
    return create_trial(str(tmp_path / name))


def fired(rule):
    return invoke_rule(rule, report_path=None).violation_steps


# --- VanishingGradient -----------------------------------------------------------------------------
@pytest.mark.parametrize("reductions", [RAW, smd.ReductionConfig(abs_reductions=["mean"])], ids=["raw", "reductions"])
def test_vanishing_gradient(tmp_path, reductions):
    def record(hook, step, mode, tiny_from=3):
        scale = 1e-9 if step >= tiny_from else 1e-3
        hook.record("gradient/fc1.weight", rng.standard_normal((16, 8)).astype(np.float32) * scale)
        hook.record("gradient/fc1.bias", np.full(8, 0.1, np.float32))

    trial = make_run(tmp_path, record, 5, reductions=reductions)
    assert fired(VanishingGradient(trial)) == [3, 4]
    healthy = make_run(tmp_path, lambda h, s, m: record(h, s, m, tiny_from=99), 5, reductions=reductions, name="ok")
    assert fired(VanishingGradient(healthy)) == []
    assert fired(VanishingGradient(trial, threshold=1e-12)) == []


# --- ExplodingTensor -------------------------------------------------------------------------------
def test_exploding_tensor_raw_values(tmp_path):
    def record(hook, step, mode):
        w = rng.standard_normal((4, 4)).astype(np.float32)
        if step == 2:
            w[1, 1] = np.nan
        if step == 4:
            w[0, 0] = np.inf
        hook.record("fc.weight", w)

    trial = make_run(tmp_path, record, 6)
    assert fired(ExplodingTensor(trial)) == [2, 4]
    assert fired(ExplodingTensor(trial, only_nan=True)) == [2]
    assert fired(ExplodingTensor(trial, collection_names="gradients")) == []  # nothing selected there
    healthy = make_run(tmp_path, lambda h, s, m: h.record("fc.weight", np.ones((4, 4))), 4, name="ok")
    assert fired(ExplodingTensor(healthy)) == []


def test_exploding_tensor_from_min_max_reductions_only(tmp_path):
    def record(hook, step, mode):
        g = np.full((64,), 0.5, np.float32)
        if step == 3:
            g[7] = -np.inf
        hook.record("gradient/w", g)

    trial = make_run(tmp_path, record, 5, reductions=smd.ReductionConfig(reductions=["min", "max", "mean"]))
    with pytest.raises(smd.exceptions.TensorUnavailableForStep):
        trial.tensor("gradient/w").value(3)  # no full tensor: the rule has only the reductions
    assert fired(ExplodingTensor(trial, collection_names="gradients")) == [3]
    assert fired(ExplodingTensor(trial, collection_names="gradients", only_nan=True)) == []


def test_exploding_tensor_reads_health_reductions_for_what_they_say(tmp_path):
    """A NaN kurtosis or underflow fraction says "undefined here" (one element, all equal, no
    nonzero element), not that the tensor holds a NaN; the nonfinite count says that."""
    def record(hook, step, mode):
        hook.record("fc.bias", np.array([0.25], np.float32))  # one element: kurtosis NaN at every step
        hook.record("fc.weight", np.zeros((4, 4), np.float32))  # no nonzero element: underflow NaN
        g = np.full(16, 0.5, np.float32)
        if step == 2:
            g[3] = np.nan
        hook.record("gradient/fc.weight", g)

    health = smd.ReductionConfig(reductions=["nonfinite", "kurtosis", "underflow_bf16"])
    trial = make_run(tmp_path, record, 4, reductions=health, collections=("gradients", "weights", "biases"))
    assert np.isnan(trial.tensor("fc.bias").reduction_value(0, "kurtosis"))
    assert fired(ExplodingTensor(trial)) == [2]
    assert fired(ExplodingTensor(trial, only_nan=True)) == []  # a count does not tell NaN from infinity


# --- LossNotDecreasing -----------------------------------------------------------------------------
def test_loss_not_decreasing_as_sagemaker_documents_it(tmp_path):
    """Constructed in user code, the rule compares the loss with the loss num_steps earlier,
    point to point, every num_steps steps (SageMaker Debugger's built-in rules reference)."""
    flat = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", 1.0), 25, name="flat")
    assert fired(LossNotDecreasing(flat)) == [10, 20]
    assert fired(LossNotDecreasing(flat, num_steps=5)) == [5, 10, 15, 20]
    falling = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", 1.0 / (s + 1)), 25, name="falling")
    assert fired(LossNotDecreasing(falling)) == []
    # Falls, but by less than 50% per 10 steps.
    slow = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", 0.99 ** s), 25, name="slow")
    assert fired(LossNotDecreasing(slow)) == []
    assert fired(LossNotDecreasing(slow, diff_percent=50)) == [10, 20]
    assert fired(LossNotDecreasing(slow, use_losses_collection=False, tensor_regex="nothing")) == []
    with pytest.raises(ConfigError, match="use_losses_collection=False"):
        LossNotDecreasing(slow, use_losses_collection=False)


def test_loss_not_decreasing_fires_at_the_documented_step(tmp_path):
    """Losses 0.3, 0.33, 0.31, 0.30, 0.28 saved at steps 0-16 every 4: step 12 is the first at
    least 10 steps after the start, and 0.30 is no decrease on step 0's 0.3."""
    losses = {0: 0.3, 4: 0.33, 8: 0.31, 12: 0.30, 16: 0.28}
    trial = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", losses[s]) if s in losses else None, 17)
    assert fired(LossNotDecreasing(trial)) == [12]
    assert fired(LossNotDecreasing(trial, diff_percent=20)) == [12]


def test_loss_not_decreasing_counts_in_the_modes_own_steps(tmp_path):
    def record(hook, step, mode):
        hook.save_scalar("loss", 1.0 if mode is smd.modes.EVAL else 1.0 / (step + 1))

    trial = make_run(tmp_path, record, 0, modes=[(smd.modes.TRAIN, 12), (smd.modes.EVAL, 22)])
    assert fired(LossNotDecreasing(trial, mode="TRAIN")) == []
    assert fired(LossNotDecreasing(trial, mode="EVAL")) == [22, 32]  # EVAL steps 10 and 20
    assert fired(LossNotDecreasing(trial)) == [22, 32]


def test_loss_not_decreasing_with_sparse_saving_compares_points_as_the_reference(tmp_path):
    """Loss saved every 3 steps, num_steps=10: checked at the first saved step at least 10 after
    the previous check (12, 24, 36), against the latest value 10 or more steps back."""
    trial = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", 1.0) if s % 3 == 0 else None, 40)
    assert fired(LossNotDecreasing(trial, num_steps=10)) == [12, 24, 36]


def _noisy_loss(tmp_path, name, curve, steps=300, noise=0.1, seed=0):
    noise_at = np.random.default_rng(seed).standard_normal(steps) * noise
    return make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", curve(s) + noise_at[s]), steps, name=name)


def test_loss_not_decreasing_trusted_judges_the_trend_against_the_noise(tmp_path):
    """The default set's parameters: a warm-up of 50 steps, then a stall is a span of at least
    3 windows whose fall, at 95% confidence, is less than 5% of the loss's level."""
    trusted = dict(warmup_steps=50, stall_margin=0.05, converged_fraction=0.5)
    # Flat at 1.4 with noise 0.1: stuck, fired at the first check with 3 windows after the
    # warm-up, and at most later checks (a span whose noise leaves 5% possible does not fire).
    stuck = _noisy_loss(tmp_path, "stuck", lambda s: 1.4)
    steps = fired(LossNotDecreasing(stuck, **trusted))
    assert steps[0] == 80 and len(steps) >= 8, steps
    # A slow fall hidden in noise 3x its fall per window: the point comparison fires; the trend waits.
    slow = _noisy_loss(tmp_path, "slow", lambda s: 1.4 - 0.0015 * s, noise=0.3)
    assert fired(LossNotDecreasing(slow))
    assert fired(LossNotDecreasing(slow, **trusted)) == []
    # Rises for 20 steps (warm-up), then falls to a floor far below its start: never stuck.
    rises = _noisy_loss(tmp_path, "rises", lambda s: 0.5 + 0.004 * s if s < 20 else 0.58 * np.exp(-(s - 20) / 40) + 0.05,
                        noise=0.02)
    assert fired(LossNotDecreasing(rises)) != []
    assert fired(LossNotDecreasing(rises, **trusted)) == []
    report = invoke_rule(LossNotDecreasing(stuck, **trusted), report_path=None).to_dict()
    assert "at most" in report["worst"]["message"] and report["violations"][0]["details"]["culprit"]["first_step"] == 50


# --- Overfit ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("val_losses, expected", [
    ((1.0, 1.5, 2.0, 2.0), [10, 15, 20]),  # the gap widens and the validation loss rises: over-fitting
    ((2.0, 2.0, 2.0, 2.0), []),        # a constant gap (a harder validation set) is no trend
    ((1.2, 1.1, 1.05, 1.0), []),       # a gap that narrows
])
def test_overfit_judges_complete_evaluation_passes(tmp_path, val_losses, expected):
    """TRAIN 3 steps, EVAL 2 steps (one pass), four times, then TRAIN: a pass is judged when
    training resumes (global steps 5, 10, 15, 20), on the pass's mean."""
    passes = iter([v for v in val_losses for _ in range(2)])

    def record(hook, step, mode):
        hook.save_scalar("loss", next(passes) if mode is smd.modes.EVAL else 1.0)

    plan = [(smd.modes.TRAIN, 3), (smd.modes.EVAL, 2)] * 4 + [(smd.modes.TRAIN, 1)]
    trial = make_run(tmp_path, record, 0, modes=plan)
    assert fired(Overfit(trial)) == expected


def test_overfit_has_a_floor_on_the_runs_scale(tmp_path):
    """0.0042 against 0.0055 is a ratio of 0.3, but a gap of 0.0013 where the loss started at 1."""
    values = iter([1.0, 0.0042, 0.0042, 0.0042])

    def record(hook, step, mode):
        hook.save_scalar("loss", next(values, 0.0042))
        hook.save_scalar("val_loss", 0.0042 if step < 3 else 0.0055)

    trial = make_run(tmp_path, record, 6)
    assert fired(Overfit(trial)) == []
    assert fired(Overfit(trial, min_gap_fraction=0)) == [3, 4, 5]


def test_overfit_keras_style_names_patience_and_start_step(tmp_path):
    def record(hook, step, mode):
        hook.save_scalar("loss", 1.0)
        hook.save_scalar("val_loss", 1.0 if step < 4 else 1.5)

    trial = make_run(tmp_path, record, 8)
    assert fired(Overfit(trial)) == [4, 5, 6, 7]
    assert fired(Overfit(trial, patience=3)) == [6, 7]
    assert fired(Overfit(trial, start_step=6)) == [6, 7]
    assert fired(Overfit(trial, ratio_threshold=0.6)) == []


# --- Overtraining ----------------------------------------------------------------------------------
def test_overtraining(tmp_path):
    def record(hook, step, mode):
        hook.save_scalar("loss", 10.0 - step)          # keeps improving
        # best at step 2, then a plateau until step 8, then it rises
        hook.save_scalar("val_loss", 10.0 - step if step < 2 else 8.0 if step < 9 else 8.0 + (step - 8))

    trial = make_run(tmp_path, record, 14)
    assert fired(Overtraining(trial)) == [12, 13]      # 10 evaluation passes without improvement, and a rise
    assert fired(Overtraining(trial, patience_validation=3)) == list(range(9, 14))  # from the first rise on
    assert fired(Overtraining(trial, patience_validation=3, rise_fraction=0)) == list(range(5, 14))  # a plateau
    improving = make_run(tmp_path, lambda h, s, m: (h.save_scalar("loss", 10.0 - s),
                                                    h.save_scalar("val_loss", 10.5 - s)), 14, name="ok")
    assert fired(Overtraining(improving)) == []


def test_overtraining_without_validation_loss_says_it_cannot_judge(tmp_path):
    flat = make_run(tmp_path, lambda h, s, m: h.save_scalar("loss", 0.05 - 1e-6 * s), 12, name="flat")
    report = invoke_rule(Overtraining(flat), report_path=None).to_dict()
    assert report["triggered"] == 0 and report["datapoints"] == 0 and report["steps_without_data"] == 12
    assert "cannot tell over-training from convergence" in report["notices"][0]


def test_overtraining_relative_threshold_lets_small_losses_improve(tmp_path):
    def record(hook, step, mode):
        hook.save_scalar("loss", 0.05 * 0.9 ** step)
        hook.save_scalar("val_loss", 0.05 * 0.9 ** step)

    small = make_run(tmp_path, record, 20, name="small")
    assert fired(Overtraining(small)) == []  # improves by 10% a step: far more than 1% of its best
    # the reference's absolute delta sees no improvement; it fires on the plateau that is not one
    assert fired(Overtraining(small, delta_relative=None, patience_validation=5, rise_fraction=0)) == \
        list(range(5, 20))


def test_weight_update_ratio_reads_update_tensors_when_the_run_saved_them(tmp_path):
    """update/<weight> (the updates collection: after optimizer.step() minus before) gives the
    ratio at its own step, without weights at consecutive steps (here weights every 5 steps)."""
    def record(hook, step, mode):
        w = np.full(100, 1.0)
        if step % 5 == 0:
            hook.record("fc.weight", w)
        hook.save_tensor("update/fc.weight", w * (50.0 if step == 7 else 1e-3), "updates")

    trial = make_run(tmp_path, record, 12, collections=("weights", "updates"))
    report = invoke_rule(WeightUpdateRatio(trial), report_path=None).to_dict()
    # Only steps with both the weight and its update are judged: 0, 5, 10 (fine); the step-7
    # update has no weight to compare with (a real run saves both at the same steps).
    assert report["triggered"] == 0 and report["datapoints"] == 3

    def both(hook, step, mode):
        w = np.full(100, 1.0)
        hook.record("fc.weight", w)
        hook.save_tensor("update/fc.weight", w * (50.0 if step == 7 else 1e-3), "updates")

    trial = make_run(tmp_path, both, 12, collections=("weights", "updates"), name="both")
    report = invoke_rule(WeightUpdateRatio(trial), report_path=None).to_dict()
    assert [v["step"] for v in report["violations"]] == [7]
    assert report["violations"][0]["details"]["culprit"] == {"layer": "fc", "tensor": "fc.weight", "first_step": 7,
                                                             "ratio": pytest.approx(50.0)}


def test_rules_count_steps_without_data_per_mode(tmp_path):
    def record(hook, step, mode):
        if mode is smd.modes.TRAIN:
            hook.record("gradient/w", np.full(4, 0.5, np.float32))
        hook.save_scalar("loss", 1.0)

    trial = make_run(tmp_path, record, 0, modes=[(smd.modes.TRAIN, 3), (smd.modes.EVAL, 2)])
    report = invoke_rule(VanishingGradient(trial), report_path=None).to_dict()
    assert report["datapoints"] == 3 and report["steps_without_data"] == 2
    assert report["steps_without_data_by_mode"] == {"EVAL": 2}


def test_steps_whose_tensors_lack_what_the_rule_reads_are_not_counted_as_evaluated(tmp_path):
    # Gradients saved as l2 norms only: VanishingGradient (mean |gradient|) has nothing to read.
    def record(hook, step, mode):
        hook.record("gradient/w", np.full(4, 1e-9, np.float32))

    trial = make_run(tmp_path, record, 4, reductions=smd.ReductionConfig(norms=["l2"]))
    report = invoke_rule(VanishingGradient(trial), report_path=None).to_dict()
    assert report["datapoints"] == 0 and report["steps_without_data"] == 4
    assert report["tensors_unavailable"] == 4
    assert any("mean |value|" in notice for notice in report["notices"]), report["notices"]
    # Full values at the same steps: every step is evaluated (and fires).
    raw = make_run(tmp_path, record, 4, name="raw")
    report = invoke_rule(VanishingGradient(raw), report_path=None).to_dict()
    assert report["datapoints"] == 4 and report["steps_without_data"] == 0 and report["triggered"] == 4


# --- AllZero ----------------------------------------------------------------------------------------
def test_all_zero_raw_and_threshold(tmp_path):
    def record(hook, step, mode):
        w = rng.standard_normal(100)
        if step == 1:
            w[:] = 0
        if step == 2:
            w[:60] = 0
        hook.record("fc.weight", w)

    trial = make_run(tmp_path, record, 4)
    assert fired(AllZero(trial, collection_names="weights")) == [1]
    assert fired(AllZero(trial, tensor_regex="fc", threshold=50)) == [1, 2]
    with pytest.raises(ConfigError, match="collection_names and/or tensor_regex"):
        AllZero(trial)
    with pytest.raises(ConfigError, match="threshold=0"):
        AllZero(trial, tensor_regex="fc", threshold=0)


def test_all_zero_from_a_saved_norm(tmp_path):
    def record(hook, step, mode):
        hook.record("gradient/w", np.zeros(10) if step == 2 else np.ones(10))

    trial = make_run(tmp_path, record, 4, reductions=smd.ReductionConfig(norms=["l2"]))
    assert fired(AllZero(trial, collection_names="gradients")) == [2]
    report = invoke_rule(AllZero(trial, collection_names="gradients", threshold=50), report_path=None)
    assert report.triggered == 0 and report.to_dict()["tensors_unavailable"] == 4  # needs full tensors


# --- UnchangedTensor --------------------------------------------------------------------------------
def test_unchanged_tensor(tmp_path):
    def record(hook, step, mode):
        hook.record("frozen.weight", np.arange(6.0))
        hook.record("trained.weight", rng.standard_normal(6))

    trial = make_run(tmp_path, record, 5)
    assert fired(UnchangedTensor(trial, collection_names="weights")) == [2, 3, 4]
    assert fired(UnchangedTensor(trial, tensor_regex="trained")) == []
    assert fired(UnchangedTensor(trial, tensor_regex="frozen", num_steps=5)) == [4]
    with pytest.raises(ConfigError, match="num_steps=1"):
        UnchangedTensor(trial, tensor_regex="x", num_steps=1)


def test_unchanged_tensor_from_saved_reductions(tmp_path):
    def record(hook, step, mode):
        hook.record("gradient/w", np.full(5, 2.0) if step >= 1 else np.ones(5))

    trial = make_run(tmp_path, record, 4, reductions=smd.ReductionConfig(reductions=["mean", "max"]))
    assert fired(UnchangedTensor(trial, collection_names="gradients")) == [3]


# --- TensorVariance ---------------------------------------------------------------------------------
@pytest.mark.parametrize("reductions", [RAW, smd.ReductionConfig(reductions=["variance"], save_shape=True)],
                         ids=["raw", "reductions"])
def test_tensor_variance(tmp_path, reductions):
    def record(hook, step, mode):
        hook.record("fc.weight", rng.standard_normal(1000) * (10.0 if step == 1 else 1.0))
        hook.record("fc2.weight", np.full(10, 3.0) if step == 2 else rng.standard_normal(10))
        hook.record("out.weight", rng.standard_normal(1))  # one element: variance 0, always

    trial = make_run(tmp_path, record, 3, reductions=reductions)
    assert fired(TensorVariance(trial, collection_names="weights", max_threshold=10)) == [1]
    assert fired(TensorVariance(trial, collection_names="weights", min_threshold=1e-6)) == [2]
    assert fired(TensorVariance(trial, tensor_regex="^out.weight", min_threshold=1e-6)) == []
    assert fired(TensorVariance(trial, tensor_regex="fc.weight", max_threshold=1000, min_threshold=1e-6)) == []
    with pytest.raises(ConfigError, match="max_threshold and/or min_threshold"):
        TensorVariance(trial, tensor_regex="fc")


# --- WeightUpdateRatio ------------------------------------------------------------------------------
def test_weight_update_ratio(tmp_path):
    w = rng.standard_normal(50)

    def record(hook, step, mode):
        factor = {2: 100.0, 3: 100.0}.get(step, 1.001)  # a huge update into step 2, none into 4
        record.w = record.w * factor if step != 4 else record.w
        hook.record("fc.weight", record.w)
    record.w = w

    trial = make_run(tmp_path, record, 6)
    assert fired(WeightUpdateRatio(trial)) == [2, 3, 4]  # 2, 3: ratio 99; 4: no update at all
    assert fired(WeightUpdateRatio(trial, large_threshold=1000, small_threshold=0)) == []

    def eval_too(hook, step, mode):
        hook.record("fc.weight", w + 0.001 * step)

    trial = make_run(tmp_path, eval_too, 0, name="modes", modes=[(smd.modes.TRAIN, 3), (smd.modes.EVAL, 3)])
    assert fired(WeightUpdateRatio(trial)) == []  # EVAL steps (no training) are not compared


# --- PoorWeightInitialization ----------------------------------------------------------------------
def test_poor_weight_initialization(tmp_path):
    def good(hook, step, mode):
        hook.save_tensor("layer1_relu_input", rng.standard_normal((32, 16)), "activations")
        hook.save_tensor("layer2_relu_input", rng.standard_normal((32, 16)) * 1.5, "activations")
        hook.record("gradient/fc.weight", rng.standard_normal(100) * 0.01)
        hook.save_scalar("loss", 1.0 / (step + 1))

    trial = make_run(tmp_path, good, 12)
    assert fired(PoorWeightInitialization(trial)) == []

    def bad_variance(hook, step, mode):
        good(hook, step, mode)
        hook.save_tensor("layer3_relu_input", rng.standard_normal((32, 16)) * 100, "activations")

    trial = make_run(tmp_path, bad_variance, 12, name="variance")
    assert fired(PoorWeightInitialization(trial)) == list(range(10))  # only the first `steps` steps

    def flat_gradients(hook, step, mode):
        good(hook, step, mode)
        hook.record("gradient/fc.weight", np.full(100, 1e-3))

    trial = make_run(tmp_path, flat_gradients, 3, name="flat")
    report = invoke_rule(PoorWeightInitialization(trial), report_path=None)
    assert report.violation_steps == [0, 1, 2] and "concentrated" in report.to_dict()["violations"][0]["message"]

    def stuck_loss(hook, step, mode):
        good(hook, step, mode)
        hook.save_scalar("loss", 1.0)

    trial = make_run(tmp_path, stuck_loss, 12, name="stuck")
    assert fired(PoorWeightInitialization(trial)) == [5, 6, 7, 8, 9]
    assert fired(PoorWeightInitialization(trial, patience=8, steps=8)) == []


# --- DeadRelu / SaturatedActivation ----------------------------------------------------------------
def test_dead_relu(tmp_path):
    def record(hook, step, mode):
        x = np.maximum(rng.standard_normal((64, 20)), 0)
        if step >= 1:
            x[:, :15] = 0  # 75% of the units never fire
        hook.save_tensor("block1.relu_output", x, "activations")

    trial = make_run(tmp_path, record, 3)
    assert fired(DeadRelu(trial)) == [1, 2]
    assert fired(DeadRelu(trial, threshold_layer=80)) == []
    assert fired(DeadRelu(trial, tensor_regex="nothing_matches")) == []


def test_saturated_activation(tmp_path):
    def record(hook, step, mode):
        hook.save_tensor("layer_tanh_input", rng.standard_normal((32, 10)) + (30 if step == 1 else 0), "acts")
        hook.save_tensor("out_sigmoid_input", rng.standard_normal((32, 10)) - (40 if step == 2 else 0), "acts")
        hook.save_tensor("other_input", rng.standard_normal((32, 10)) * 100, "acts")  # neither tanh nor sigmoid

    trial = make_run(tmp_path, record, 3)
    report = invoke_rule(SaturatedActivation(trial), report_path=None)
    assert report.violation_steps == [1, 2]
    assert "layer_tanh_input" in report.to_dict()["violations"][0]["message"]
    assert fired(SaturatedActivation(trial, threshold_tanh="(-100, 100)", threshold_sigmoid=(-100, 100))) == []
    with pytest.raises(ConfigError, match="threshold_tanh"):
        SaturatedActivation(threshold_tanh=(5, -5))


# --- ClassImbalance --------------------------------------------------------------------------------
def test_class_imbalance(tmp_path):
    def imbalanced(hook, step, mode):
        labels = np.where(rng.random(100) < 0.05, 1, 0)
        hook.save_tensor("labels", labels, "labels")
        hook.save_tensor("predictions", labels, "predictions")

    trial = make_run(tmp_path, imbalanced, 7)
    assert fired(ClassImbalance(trial)) == [4, 5, 6]  # from 500 samples on

    def balanced(hook, step, mode, wrong=False):
        labels = np.arange(100) % 2
        probabilities = np.eye(2)[np.zeros(100, int) if wrong else labels] * 0.9 + 0.05
        hook.save_tensor("labels", labels, "labels")
        hook.save_tensor("predictions", probabilities, "predictions")

    trial = make_run(tmp_path, balanced, 7, name="balanced")
    assert fired(ClassImbalance(trial, argmax=True)) == []
    trial = make_run(tmp_path, lambda h, s, m: balanced(h, s, m, wrong=True), 7, name="wrong")
    report = invoke_rule(ClassImbalance(trial, argmax=True, samples=200), report_path=None)
    assert report.violation_steps == [3, 4, 5, 6]  # judged once twice `samples` predictions were seen
    assert "class 1: 100%" in report.to_dict()["violations"][0]["message"]
    # Wrong while untrained (steps 0-2), right from then on: never judged on the untrained steps alone.
    trial = make_run(tmp_path, lambda h, s, m: balanced(h, s, m, wrong=s < 3), 7, name="learns")
    assert fired(ClassImbalance(trial, argmax=True, samples=200)) == []


# --- SimilarAcrossRuns ----------------------------------------------------------------------------
def test_similar_across_runs(tmp_path):
    def record(hook, step, mode, diverge_at=None):
        value = np.arange(12.0) * (step + 1)
        hook.record("gradient/fc.weight", value / 10)
        hook.record("fc.weight", value + 1e-3 if step == diverge_at else value)

    base = make_run(tmp_path, record, 4, name="base")
    same = make_run(tmp_path, record, 4, name="same")
    other = make_run(tmp_path, lambda h, s, m: record(h, s, m, diverge_at=2), 4, name="other")
    assert fired(SimilarAcrossRuns(base, same)) == []
    assert fired(SimilarAcrossRuns(base, str(tmp_path / "other"))) == [2]
    assert fired(SimilarAcrossRuns(base, other, tensor_regex="^gradient")) == []
    short = make_run(tmp_path, record, 2, name="short")
    report = invoke_rule(SimilarAcrossRuns(base, short), report_path=None)
    assert report.triggered == 0 and report.to_dict()["steps_without_data"] == 2  # steps 2, 3 not in short
    with pytest.raises(ConfigError, match="other_trial"):
        SimilarAcrossRuns(base)


# --- XGBoost rules on crafted tensors (real XGBoost runs: tests/xgboost/test_rules_xgboost.py) ---
def _tree_table(depths):
    """trees/* columns of chain-shaped trees of the given depths (node ids as XGBoost numbers them)."""
    tree, node, ids, yes, no = [], [], [], [], []
    for t, depth in enumerate(depths):
        next_id = 1
        current = 0
        for level in range(depth + 1):
            leaf = level == depth
            left, right = (next_id, next_id + 1) if not leaf else (None, None)
            for n, is_leaf in ((current, leaf), (None, True)) if level else ((current, leaf),):
                if n is None:
                    continue
                tree.append(t), node.append(n), ids.append(f"{t}-{n}")
                yes.append("" if is_leaf else f"{t}-{left}"), no.append("" if is_leaf else f"{t}-{right}")
            if not leaf:
                tree.append(t), node.append(right), ids.append(f"{t}-{right}"), yes.append(""), no.append("")
                current, next_id = left, next_id + 2
    return {"Tree": np.array(tree), "Node": np.array(node), "ID": np.array(ids), "Yes": np.array(yes),
            "No": np.array(no)}


def test_tree_depth_on_crafted_tree_tensors(tmp_path):
    def record(hook, step, mode):
        for column, values in _tree_table([2, 3] if step == 0 else [2, 6]).items():
            hook.save_tensor(f"trees/{column}", values, "trees")

    trial = make_run(tmp_path, record, 2)
    report = invoke_rule(TreeDepth(trial, depth=4), report_path=None)
    assert report.violation_steps == [1]
    assert report.to_dict()["violations"][0]["details"]["max_depth"] == 6
    assert fired(TreeDepth(trial)) == []  # depth 6 is XGBoost's default max_depth
    assert fired(TreeDepth(trial, depth=5)) == [1]


def test_feature_importance_overweight_on_crafted_tensors(tmp_path):
    def record(hook, step, mode):
        weights = [50, 30, 15, 3, 1, 1] if step == 1 else [10, 9, 8, 8, 7, 7]
        for i, w in enumerate(weights):
            hook.save_tensor(f"feature_importance/weight/f{i}", np.array([float(w)]), "feature_importance")
        hook.save_tensor("feature_importance/gain/f0", np.array([1000.0]), "feature_importance")

    trial = make_run(tmp_path, record, 3)
    assert fired(FeatureImportanceOverweight(trial)) == [1]
    assert fired(FeatureImportanceOverweight(trial, threshold=0.99)) == []
    assert fired(FeatureImportanceOverweight(trial, nfeatures=6)) == [0, 1, 2]  # all the features there are


# --- LossSpike --------------------------------------------------------------------------------------
def test_loss_spike_names_the_layer_that_jumped_first(tmp_path):
    """A loss of 1 +- batch noise; at step 30 fc2's gradient norm jumps 100x, at step 31 the loss is 8."""
    def record(hook, step, mode):
        hook.save_tensor("loss", np.float32(8.0 if step == 31 else 1.0 + 0.05 * rng.standard_normal()), "losses")
        for layer in ("fc1", "fc2", "fc3"):
            scale = 100.0 if (layer == "fc2" and step == 30) else 1.0
            hook.record(f"gradient/{layer}.weight", rng.standard_normal(50) * 0.01 * scale)

    trial = make_run(tmp_path, record, 40, collections=("gradients", "losses"))
    report = invoke_rule(LossSpike(trial), report_path=None).to_dict()
    assert [v["step"] for v in report["violations"]] == [31]
    culprit = report["violations"][0]["details"]["culprit"]
    assert culprit["layer"] == "fc2" and culprit["tensor"] == "gradient/fc2.weight" and culprit["first_step"] == 30
    assert report["actions"][0]["action"] == "DumpFlightRecorder"  # offline: says there is no recorder
    assert "no flight recorder here" in report["actions"][0]["result"]
    # Batch noise of a converged loss is no spike: 0.05 after a median of 0.005, with the loss starting at 2.
    quiet = make_run(tmp_path, lambda h, s, m: h.save_tensor(
        "loss", np.float32(2.0 if s == 0 else 0.05 if s % 17 == 0 else 0.005 + 0.002 * rng.random()), "losses"),
        60, name="quiet", collections=("losses",))
    assert fired(LossSpike(quiet)) == []
    assert fired(LossSpike(quiet, min_rise_fraction=0, min_zscore=0, max_rise_factor=0)) == [17, 34, 51]

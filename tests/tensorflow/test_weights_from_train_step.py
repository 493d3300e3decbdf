"""Trainable weights copied inside fit's compiled train step (the optimizer's apply site)
instead of being read when the step begins, and the fallback read everywhere else."""
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug import reductions as reference  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

from conftest import make_recorder  # noqa: E402

# 10 samples, batch 4 -> 3 TRAIN batches (the last one of 2: a retrace); 6 validation samples,
# batch 4 -> 2 EVAL batches; 2 epochs.
TRAIN_STEPS = [0, 1, 2, 5, 6, 7]
EVAL_STEPS = [3, 4, 8, 9]
LAYERS = {"d1": ("kernel", "bias"), "bn": ("gamma", "beta", "moving_mean", "moving_variance"), "d2": ("kernel", "bias")}
KEYS = [("min", False), ("max", False), ("mean", False), ("l2", False)]


def make_bn_model(**compile_kwargs):
    """Dense -> BatchNormalization (non-trainable moving statistics) -> Dense."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(3, name="d1")(inputs)
    hidden = keras.layers.BatchNormalization(name="bn")(hidden)
    outputs = keras.layers.Dense(2, name="d2")(hidden)
    model = keras.Model(inputs, outputs, name="bnnet")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **compile_kwargs)
    return model


def data():
    rng = np.random.default_rng(3)
    return rng.standard_normal((10, 4)).astype("float32"), rng.standard_normal((10, 2)).astype("float32")


def fit_counting_reads(model, hook, **fit_kwargs):
    """fit with validation; returns the recorder and, per global step, the names of the
    variables read when the step began."""
    x, y = data()
    reads = {}
    read = hook._read_variables

    def counting(variables):
        reads.setdefault(hook.global_step, set()).update(v.path for v in variables)
        return read(variables)

    hook._read_variables = counting
    recorder = make_recorder()
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, validation_data=(x[:6], y[:6]),
              callbacks=[hook, recorder], verbose=0, **fit_kwargs)
    hook.close()
    return recorder, reads


def check_saved_weights_equal_get_weights(trial, recorder, steps, raw):
    for step in steps:
        for layer, variables in LAYERS.items():
            for var, value in zip(variables, recorder.weights[step][layer]):
                tensor = trial.tensor(f"{layer}/weights/{layer}/{var}")
                if raw:
                    assert np.array_equal(tensor.value(step), value), (step, layer, var)
                else:
                    saved = tensor.reduction_values(step)
                    for key in KEYS:
                        want = float(reference.reduce(value, key[0], key[1]))
                        assert saved[key] == pytest.approx(want, rel=1e-6, abs=1e-7), (step, layer, var, key)


@pytest.mark.parametrize("raw", [False, True], ids=["reductions", "raw"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "jit_compile"])
def test_trainable_weights_come_from_the_train_step_and_equal_get_weights(tmp_path, raw, jit_compile):
    model = make_bn_model(jit_compile=jit_compile)
    config = None if raw else smd.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"])
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "gradients"], reduction_config=config)
    recorder, reads = fit_counting_reads(model, hook)
    trainable = {v.path for v in model.trainable_weights}
    moving = {v.path for v in model.non_trainable_weights}
    assert moving and trainable
    # The first TRAIN step reads everything (the train step is traced in it); later TRAIN
    # steps read only the non-trainable statistics: the site copies the trainable weights.
    assert reads[0] >= trainable | moving
    for step in TRAIN_STEPS[1:]:
        assert reads[step] == moving, step
    # Validation (EVAL) steps do not run the optimizer: everything is read when they begin.
    for step in EVAL_STEPS:
        assert reads[step] >= trainable | moving, step
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == sorted(TRAIN_STEPS + EVAL_STEPS)
    check_saved_weights_equal_get_weights(trial, recorder, TRAIN_STEPS + EVAL_STEPS, raw)
    assert trial.tensor("gradients/d1/kernelGrad").steps() == TRAIN_STEPS


def test_steps_per_execution_reads_weights_when_the_step_begins(tmp_path):
    # One step covers two batches: the site would copy the second batch's weights, so the
    # weights of the step (before its first batch) are read when it begins.
    model = make_bn_model(steps_per_execution=2)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "gradients"])
    recorder, reads = fit_counting_reads(model, hook)
    trainable = {v.path for v in model.trainable_weights}
    trial = create_trial(str(tmp_path / "run"))
    train_steps = [s for s in trial.steps() if trial.mode_modestep(s)[0] == smd.modes.TRAIN]
    assert len(train_steps) == 4  # 2 epochs x (batches 1-2, batch 3)
    for step in trial.steps():
        assert reads[step] >= trainable, step
    check_saved_weights_equal_get_weights(trial, recorder, trial.steps(), raw=True)


def test_weights_are_not_read_at_step_begin_with_reductions_only_gradients_excluded(tmp_path):
    # Weights without gradients: the optimizer is wrapped for them alone.
    model = make_bn_model()
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases"],
                         reduction_config=smd.ReductionConfig(norms=["l2"]))
    recorder, reads = fit_counting_reads(model, hook)
    trainable = {v.path for v in model.trainable_weights}
    for step in TRAIN_STEPS[1:]:
        assert not reads.get(step, set()) & trainable, step
    trial = create_trial(str(tmp_path / "run"))
    assert not [n for n in trial.tensor_names() if n.startswith("gradients/")]
    for step in TRAIN_STEPS + EVAL_STEPS:
        kernel = recorder.weights[step]["d1"][0]
        assert trial.tensor("d1/weights/d1/kernel").reduction_value(step, "l2") == \
            pytest.approx(float(np.linalg.norm(kernel)), rel=1e-6), step

"""Reductions computed inside the compiled step (capture REDUCE mode) and the fallback to
whole copies (COPY) when the configuration no longer matches what was traced."""
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug import reductions as reference  # noqa: E402
from smdebug.tensorflow import capture  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

PARAMS = ["weights", "biases", "gradients"]
KEYS = [("min", False), ("max", False), ("mean", False), ("std", False), ("variance", False), ("sum", True),
        ("prod", False), ("median", False), ("l1", False), ("l2", False), ("max", True)]
CONFIG = smd.ReductionConfig(reductions=["min", "max", "mean", "std", "variance", "prod", "median"],
                             abs_reductions=["sum", "max"], norms=["l1", "l2"])
STEPS = 6


def make_model(jit_compile=False):
    """Dense(4 -> 2100): a kernel over SEGMENT_MAX_NUMEL elements (reduced on its own)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2100, activation="tanh", name="d1"),
                              keras.layers.Dense(2, name="d2")], name="wide")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
    return model


def data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((4 * STEPS, 4)).astype("float32"), rng.standard_normal((4 * STEPS, 2)).astype("float32")


def fit(tmp_path, name, jit_compile, callbacks=(), **hook_kwargs):
    x, y = data()
    model = make_model(jit_compile)
    hook = smd.KerasHook(out_dir=tmp_path / name, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=PARAMS, **hook_kwargs)
    modes = []

    class Modes(keras.callbacks.Callback):  # after the hook: the modes its variants ran in
        def on_train_batch_end(self, batch, logs=None):
            modes.append(sorted({v.mode for s in hook._capture._sites.values() for v in s.variants.values()}))

    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[*(c(hook) for c in callbacks), hook, Modes()])
    hook.close()
    return create_trial(str(tmp_path / name)), modes


def check_against_raw(trial, raw, steps, keys_at=lambda step: KEYS):
    names = [n for n in raw.tensor_names() if n.startswith(("gradients/", "d1/", "d2/"))]
    assert len(names) == 8
    for step in steps:
        for name in names:
            value = raw.tensor(name).value(step)
            saved = trial.tensor(name).reduction_values(step)
            assert set(saved) == set(keys_at(step)), (step, name)
            for (op, is_abs), got in saved.items():
                want = float(reference.reduce(value, op, is_abs))
                if np.isnan(want):  # e.g. the kurtosis of a bias of zeros
                    assert np.isnan(got), (step, name, op, is_abs)
                    continue
                assert got == pytest.approx(want, rel=2e-6, abs=1e-7 * max(1.0, float(np.abs(value).max()))), \
                    (step, name, op, is_abs)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "jit_compile"])
def test_reductions_computed_in_the_train_step_equal_the_reference(tmp_path, jit_compile):
    raw, raw_modes = fit(tmp_path, "raw", jit_compile)
    trial, modes = fit(tmp_path, "reduced", jit_compile, reduction_config=CONFIG)
    assert trial.steps() == list(range(STEPS))
    # Every step ran in REDUCE mode (no whole copies, no end-of-step reader).
    assert modes == [[capture.REDUCE]] * STEPS
    check_against_raw(trial, raw, range(STEPS))


def test_configuration_changed_after_tracing_gives_the_new_reductions(tmp_path):
    """In fit, a step whose plans the traced train function cannot deliver runs a new one
    (custom loops fall back to whole copies instead: see the next test)."""
    raw, _ = fit(tmp_path, "raw", False)
    original = CONFIG
    fewer = smd.ReductionConfig(reductions=["max"], norms=["l2"])
    other = smd.ReductionConfig(reductions=["min"], abs_reductions=["mean"])

    def changer(hook):
        class Changer(keras.callbacks.Callback):  # before the hook: the step begins with the new config
            def on_train_batch_begin(self, batch, logs=None):
                config = {2: fewer, 3: other, 4: original}.get(batch)
                if config is not None:
                    for coll in PARAMS:
                        hook.get_collection(coll).reduction_config = config

        return Changer()

    trial, modes = fit(tmp_path, "changed", False, callbacks=[changer], reduction_config=CONFIG)
    # Step 2 asks for keys the traced layout has; steps 3 and 4 for others: traced again.
    assert modes == [[capture.REDUCE]] * STEPS
    keys = {2: [("max", False), ("l2", False)], 3: [("min", False), ("mean", True)]}
    check_against_raw(trial, raw, range(STEPS), keys_at=lambda step: keys.get(step, KEYS))


def test_a_site_that_did_not_run_saves_nothing_stale(tmp_path):
    """REDUCE step, COPY step, then a REDUCE step in which the site does not run: its vector
    still holds the first step's values, which must not be taken for this step's."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 4)).astype("float32"), rng.standard_normal((8, 1)).astype("float32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")],
                             name="seq")
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["gradients"], reduction_config=smd.ReductionConfig(norms=["l2"]))
    optimizer = hook.wrap_optimizer(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)

    @tf.function
    def train(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return grads

    gradients = hook.get_collection("gradients")
    hook.set_mode(smd.modes.TRAIN)
    norms = {}
    for step, (run, config) in enumerate([(True, None), (True, smd.ReductionConfig(norms=["l1"])),
                                          (False, smd.ReductionConfig(norms=["l2"])), (True, None)]):
        if config is not None:
            gradients.reduction_config = config
        hook.begin_step()
        if run:
            grads = train(x[2 * step:2 * step + 4], y[2 * step:2 * step + 4])
            norms[step] = np.linalg.norm(grads[0].numpy().ravel(), ord=1 if step == 1 else 2)
        (site,) = hook._capture._sites.values()
        (variant,) = site.variants.values()
        assert variant.mode == (capture.COPY if step == 1 else capture.REDUCE), step
        hook.end_step()  # before the next configuration change, as fit does
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    tensor = trial.tensor("gradients/seq/d1/kernelGrad")
    assert tensor.reduction_value(0, "l2") == pytest.approx(norms[0], rel=1e-6)
    assert tensor.reduction_value(1, "l1") == pytest.approx(norms[1], rel=1e-6)
    assert 2 not in trial.steps()  # nothing ran, nothing saved (not step 0's values again)
    assert tensor.reduction_value(3, "l2") == pytest.approx(norms[3], rel=1e-6)


HEALTH = ["nonfinite", "zero_fraction", "kurtosis", "overflow_fp8_e4m3", "underflow_bf16", "underflow_fp8_e5m2"]


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "jit_compile"])
def test_health_reductions_computed_in_the_train_step_equal_the_reference(tmp_path, jit_compile):
    raw, _ = fit(tmp_path, "raw", jit_compile)
    trial, modes = fit(tmp_path, "reduced", jit_compile,
                       reduction_config=smd.ReductionConfig(reductions=HEALTH, abs_reductions=["kurtosis"]))
    assert modes == [[capture.REDUCE]] * STEPS
    check_against_raw(trial, raw, range(STEPS), lambda step: [(op, False) for op in HEALTH] + [("kurtosis", True)])

"""The ``updates`` collection of the KerasHook: ``update/<weight name>`` is what the optimizer's
``apply`` did to the weight in that step (the value just after it minus the value just before).

The weights saved at a step are those before its update, so the update of step s is
weight(s + 1) - weight(s); the last step's is the weights after fit minus those of that step.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug import reductions as reference  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.5), "adam": lambda: keras.optimizers.Adam(0.01)}
#: 12 samples, batch 4: TRAIN steps 0..5 over 2 epochs
STEPS = 6
HEALTH = ["nonfinite", "zero_fraction", "kurtosis", "overflow_fp16", "underflow_bf16"]


def make_model(optimizer, **compile_kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh", name="d1"),
                              keras.layers.Dense(2, name="d2")], name="net")
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse", **compile_kwargs)
    return model


def fit(model, hook, close=True):
    """fit for 2 epochs (then close the hook); returns the trainable weights by saved name before each TRAIN step, and after fit."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((12, 4)).astype("float32"), rng.standard_normal((12, 2)).astype("float32")
    before = []

    class Before(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            before.append(current(self.model))

    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, callbacks=[hook, Before()], verbose=0)
    if close:
        hook.close()
    return before + [current(model)]


def current(model):
    return {f"{layer.name}/weights/{v.path}": np.array(v.numpy(), copy=True)
            for layer in model.layers for v in layer.trainable_weights}


def expected_update(weights, step, name):
    return weights[step + 1][name] - weights[step][name]


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_full_updates_are_after_minus_before_the_optimizer_apply(tmp_path, optimizer, run_eagerly):
    model = make_model(optimizer, run_eagerly=run_eagerly, jit_compile=False)
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "updates"],
                         reduction_config=smd.ReductionConfig(save_raw_tensor=True))
    weights = fit(model, hook)
    trial = create_trial(str(tmp_path / "run"))
    names = sorted(weights[0])
    assert names == ["d1/weights/net/d1/bias", "d1/weights/net/d1/kernel",
                     "d2/weights/net/d2/bias", "d2/weights/net/d2/kernel"]
    assert sorted(trial.tensor_names(collection="updates")) == ["update/" + n for n in names]
    for name in names:
        update = trial.tensor("update/" + name)
        assert update.steps() == list(range(STEPS))
        for step in range(STEPS):
            np.testing.assert_array_equal(trial.tensor(name).value(step), weights[step][name])
            np.testing.assert_array_equal(update.value(step), expected_update(weights, step, name))
        assert np.any(update.value(0) != 0)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_update_reductions_at_every_third_step_are_those_of_the_step_update(tmp_path, optimizer):
    model = make_model(optimizer, jit_compile=False)
    config = smd.ReductionConfig(reductions=["min", "max", "mean"] + HEALTH, abs_reductions=["max"], norms=["l2"])
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=3),
                         include_collections=["updates"], reduction_config=config)
    weights = fit(model, hook)
    trial = create_trial(str(tmp_path / "run"))
    keys = [(r, False) for r in ["min", "max", "mean"] + HEALTH] + [("max", True), ("l2", False)]
    assert sorted(trial.tensor_names(collection="updates")) == sorted("update/" + n for n in weights[0])
    for name in weights[0]:
        tensor = trial.tensor("update/" + name)
        assert tensor.steps() == [0, 3]
        for step in (0, 3):
            saved = tensor.reduction_values(step)
            full = expected_update(weights, step, name)
            for key in keys:
                want = float(reference.reduce(full, *key))
                assert saved[key] == pytest.approx(want, rel=1e-5, abs=1e-7, nan_ok=True), (name, step, key)


def test_update_ratios_pair_keras_updates_with_their_weights(tmp_path):
    model = make_model("sgd")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                         include_collections=["weights", "biases", "updates"],
                         reduction_config=smd.ReductionConfig(norms=["l2"]))
    weights = fit(model, hook)
    ratios = create_trial(str(tmp_path / "run")).update_ratios()
    assert sorted(set(ratios["tensor"])) == sorted(weights[0])
    assert sorted(set(ratios["step"])) == [0, 2, 4]
    for row in ratios.itertuples():
        with np.errstate(divide="ignore"):  # the biases start at 0: an infinite ratio
            want = np.linalg.norm(expected_update(weights, row.step, row.tensor)) / np.linalg.norm(
                weights[row.step][row.tensor])
        assert row.value == pytest.approx(want, rel=1e-5), (row.tensor, row.step)


def test_steps_that_save_no_updates_run_a_function_without_them(tmp_path):
    # Steps 0 and 3 save updates; had steps 4 and 5 computed theirs, the stashes would hold step 5's.
    model = make_model("adam")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=3),
                         include_collections=["updates"])
    weights = fit(model, hook, close=False)
    functions = [f for loop in hook._step_functions._loops.values() for f in (loop.functions or {}).values()]
    assert sorted("updates" in (f.saves or ()) for f in functions) == [False, True]
    stashes = hook._updates._stashes.values()
    assert len(stashes) == 4
    for var, stash in stashes:
        name = hook._weights.names[id(var)]
        np.testing.assert_array_equal(stash.numpy(), expected_update(weights, 3, name))
    hook.close()


@pytest.mark.parametrize("jit_compile", [None, False, True], ids=["eager", "tf.function", "jit_compile"])
def test_custom_loop_with_wrapped_tape_and_optimizer_saves_the_updates_of_saved_steps(tmp_path, jit_compile):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")],
                             name="seq")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2),
                         include_collections=["updates"], reduction_config=smd.ReductionConfig(save_raw_tensor=True))
    optimizer = hook.wrap_optimizer(keras.optimizers.Adam(0.01))

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    step = step if jit_compile is None else tf.function(step, jit_compile=jit_compile)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 4)).astype("float32"), rng.standard_normal((8, 1)).astype("float32")
    hook.set_mode(smd.modes.TRAIN)
    weights = []
    for i in range(6):  # steps 0, 2 and 4 save
        weights.append({"weights/" + v.path: v.numpy().copy() for v in model.trainable_variables})
        if jit_compile:
            hook.begin_step()  # a tape entered under XLA cannot begin steps
        step(x[i:i + 4], y[i:i + 4])
    weights.append({"weights/" + v.path: v.numpy().copy() for v in model.trainable_variables})
    for var, stash in hook._updates._stashes.values():  # graphs: the flag kept step 5 out
        np.testing.assert_array_equal(stash.numpy(), expected_update(weights, 4, hook._weights.names[id(var)]))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert sorted(trial.tensor_names(collection="updates")) == sorted("update/" + n for n in weights[0])
    for name in weights[0]:
        assert trial.tensor("update/" + name).steps() == [0, 2, 4]
        for s in (0, 2, 4):
            np.testing.assert_array_equal(trial.tensor("update/" + name).value(s), expected_update(weights, s, name))


def test_mirrored_strategy_saves_the_chief_replica_update(tmp_path, mirrored_strategy):
    with mirrored_strategy.scope():
        model = make_model("adam")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["updates"], reduction_config=smd.ReductionConfig(save_raw_tensor=True))
    weights = fit(model, hook)
    trial = create_trial(str(tmp_path / "run"))
    for name in weights[0]:
        assert trial.tensor("update/" + name).steps() == list(range(STEPS))
        for step in range(STEPS):
            np.testing.assert_array_equal(trial.tensor("update/" + name).value(step), expected_update(weights, step, name))


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_a_failure_in_the_updates_warns_once_and_turns_only_them_off(tmp_path, run_eagerly, monkeypatch,
                                                                     smdebug_warnings):
    from smdebug.tensorflow.updates import KerasUpdates

    def broken(self, *args):
        raise RuntimeError("injected")

    monkeypatch.setattr(KerasUpdates, "_snapshot" if run_eagerly else "_stash_for", broken)
    model = make_model("sgd", run_eagerly=run_eagerly)
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "updates"])
    weights = fit(model, hook)
    assert len([m for m in smdebug_warnings(messages=True) if "injected" in m]) == 1
    trial = create_trial(str(tmp_path / "run"))
    assert not trial.tensor_names(collection="updates")
    kernel = "d1/weights/net/d1/kernel"
    assert trial.tensor(kernel).steps() == list(range(STEPS))
    np.testing.assert_array_equal(trial.tensor(kernel).value(STEPS - 1), weights[STEPS - 1][kernel])

"""Custom training loops: wrap_tape / wrap_optimizer eagerly, in tf.function and under XLA."""
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

COLLECTIONS = ["weights", "biases", "gradients", "losses"]


def small_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")],
                            name="seq")


def run_loop(hook, step_fn, model, x, y, steps, begin_from_python=False):
    """Run ``steps`` steps; returns per-step (weights before, loss, gradients) computed by the loop."""
    record = []
    for i in range(steps):
        weights = [v.numpy().copy() for v in model.trainable_variables]
        if begin_from_python:
            hook.begin_step()
        loss, grads = step_fn(x[2 * i:2 * i + 4], y[2 * i:2 * i + 4])
        record.append((weights, float(loss), [g.numpy() for g in grads]))
    return record


def make_step(hook, model, optimizer, jit_compile=None, wrap=True):
    def step(xb, yb):
        tape = tf.GradientTape()
        with (hook.wrap_tape(tape) if wrap else tape) as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads

    return step if jit_compile is None else tf.function(step, jit_compile=jit_compile)


@pytest.fixture
def xy():
    rng = np.random.default_rng(3)
    return rng.standard_normal((20, 4)).astype("float32"), rng.standard_normal((20, 1)).astype("float32")


@pytest.mark.parametrize("jit_compile", [None, False], ids=["eager", "tf.function"])
def test_wrap_tape_saves_losses_gradients_and_weights_before_the_update(tmp_path, xy, jit_compile):
    x, y = xy
    model, optimizer = small_model(), keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=2),
                         include_collections=COLLECTIONS)
    hook.set_mode(smd.modes.TRAIN)
    record = run_loop(hook, make_step(hook, model, optimizer, jit_compile), model, x, y, steps=5)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 2, 4]
    for step in (0, 2, 4):
        weights, loss, grads = record[step]
        assert trial.tensor("loss").value(step) == pytest.approx(loss, rel=1e-6)
        np.testing.assert_allclose(trial.tensor("gradients/seq/d1/kernelGrad").value(step), grads[0], rtol=1e-6)
        np.testing.assert_allclose(trial.tensor("gradients/seq/d2/biasGrad").value(step), grads[3], rtol=1e-6)
        np.testing.assert_array_equal(trial.tensor("weights/seq/d1/kernel").value(step), weights[0])
        np.testing.assert_array_equal(trial.tensor("weights/seq/d2/bias").value(step), weights[3])
    assert trial.tensor_names(collection="biases") == ["weights/seq/d1/bias", "weights/seq/d2/bias"]


def test_set_mode_between_tf_function_steps(tmp_path, xy):
    x, y = xy
    model, optimizer = small_model(), keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["losses", "gradients"])
    train = make_step(hook, model, optimizer, jit_compile=False)

    @tf.function
    def evaluate(xb, yb):
        with hook.wrap_tape(tf.GradientTape()):
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        hook.save_scalar("eval_loss", loss)
        hook.save_tensor("eval_predictions", model(xb), "eval_outputs")
        return loss

    hook.set_mode(smd.modes.TRAIN)
    train(x[:4], y[:4])
    train(x[4:8], y[4:8])
    hook.set_mode(smd.modes.EVAL)
    eval_losses = [float(evaluate(x[:4], y[:4])), float(evaluate(x[4:8], y[4:8]))]
    hook.set_mode(smd.modes.TRAIN)
    train(x[8:12], y[8:12])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3, 4]
    assert [trial.mode_modestep(s) for s in trial.steps()] == [
        (smd.modes.TRAIN, 0), (smd.modes.TRAIN, 1), (smd.modes.EVAL, 0), (smd.modes.EVAL, 1), (smd.modes.TRAIN, 2)]
    assert trial.tensor("gradients/seq/d1/kernelGrad").steps() == [0, 1, 4]
    assert [trial.tensor("scalar/eval_loss").value(s).item() for s in (2, 3)] == pytest.approx(eval_losses)
    assert trial.tensor("eval_predictions").value(3).shape == (4, 1)
    assert trial.tensor_names(collection="eval_outputs") == ["eval_predictions"]


def test_jit_compile_with_steps_begun_from_python(tmp_path, xy):
    """Under XLA no Python runs in the step: the loop begins steps, the graph still captures."""
    x, y = xy
    model, optimizer = small_model(), keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=2),
                         include_collections=COLLECTIONS)
    hook.set_mode(smd.modes.TRAIN)
    record = run_loop(hook, make_step(hook, model, optimizer, jit_compile=True), model, x, y, steps=4,
                      begin_from_python=True)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 2]
    for step in (0, 2):
        weights, loss, grads = record[step]
        assert trial.tensor("loss").value(step) == pytest.approx(loss, rel=1e-6)
        np.testing.assert_allclose(trial.tensor("gradients/seq/d1/kernelGrad").value(step), grads[0], rtol=1e-6)
        np.testing.assert_array_equal(trial.tensor("weights/seq/d1/kernel").value(step), weights[0])


def test_wrap_optimizer_in_tf_function_captures_applied_gradients(tmp_path, xy):
    x, y = xy
    model = small_model()
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["gradients", "optimizer_variables"])
    optimizer = hook.wrap_optimizer(keras.optimizers.Adam(0.01))
    optimizer.build(model.trainable_variables)
    step = make_step(hook, model, optimizer, jit_compile=False, wrap=False)
    hook.set_mode(smd.modes.TRAIN)
    record = run_loop(hook, step, model, x, y, steps=3, begin_from_python=True)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2]
    for s in range(3):
        np.testing.assert_allclose(trial.tensor("gradients/seq/d2/kernelGrad").value(s), record[s][2][2], rtol=1e-6)
        # Optimizer state is read when the step begins: before that step's update.
        assert int(trial.tensor("Adam/iteration").value(s)) == s  # Keras' "adam_<n>": named after the class
    assert "Adam/seq_d1_kernel_momentum" in trial.tensor_names(collection="optimizer_variables")


def test_wrap_tape_and_wrap_optimizer_reject_wrong_types(tmp_path):
    hook = smd.KerasHook(out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="tf.GradientTape"):
        hook.wrap_tape(object())
    with pytest.raises(ConfigError, match="SessionHook.wrap_optimizer"):
        hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    hook.close()


def test_nothing_saved_means_nothing_runs(tmp_path, xy):
    """Between saved steps the capture flags stay down: the graph copies nothing."""
    x, y = xy
    model, optimizer = small_model(), keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_steps=[2], save_interval=10**6,
                                                                              start_step=1),
                         include_collections=COLLECTIONS)
    hook.set_mode(smd.modes.TRAIN)
    record = run_loop(hook, make_step(hook, model, optimizer, jit_compile=False), model, x, y, steps=5)
    (site,) = hook._capture._sites.values()
    (variant,) = site.variants.values()
    stash = dict(zip(variant.names, variant.stash))
    flag_after = int(variant.flag.numpy())
    hook.close()
    # The stash still holds step 2's gradient: steps 3 and 4 did not copy anything.
    np.testing.assert_array_equal(stash["gradients/seq/d1/kernelGrad"].numpy(), record[2][2][0])
    assert not np.array_equal(record[2][2][0], record[4][2][0])
    assert int(variant.copies.numpy()) == 1 and not flag_after  # copied in step 2 only
    assert create_trial(str(tmp_path / "run")).steps() == [2]


def test_register_model_captures_layer_outputs_in_a_custom_loop(tmp_path, xy):
    """1.0.34's KerasHook.register_model(model), for loops that call the model themselves."""
    x, y = xy
    model, optimizer = small_model(), keras.optimizers.SGD(0.1)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["layers"])
    hook.register_model(model)
    assert hook.model is model
    hook.set_mode(smd.modes.TRAIN)
    record = run_loop(hook, make_step(hook, model, optimizer), model, x, y, steps=2)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    for step in (0, 1):
        kernel, bias = record[step][0][:2]  # d1's weights when the step ran
        want = x[2 * step:2 * step + 4] @ kernel + bias
        np.testing.assert_allclose(trial.tensor("d1/outputs").value(step), want, rtol=1e-5, atol=1e-6)

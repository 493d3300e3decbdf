"""KerasHook with Keras 3 on JAX: what fit/evaluate/predict save, read back from the files.

Under JAX, Keras compiles its train and predict steps with jax.jit and keeps the current
variable values in the trainer's state; the hook syncs them back (Keras' public
``jax_state_sync``) on saved steps only. Tensors computed inside the compiled step
(gradients, model inputs/labels/predictions in fit) are tracers there: they are skipped
with one warning each, and saved with ``run_eagerly=True``.
"""
import logging
import sys

import keras
import numpy as np
import pytest

import smdebug.tensorflow as smd
from smdebug.trials import create_trial

LR = 0.1


def fit_and_predict(out_dir, run_eagerly, collections=("weights", "biases", "gradients", "losses", "metrics")):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu", name="d1"),
                              keras.layers.Dense(2, name="d2")], name="net")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", metrics=["mae"], run_eagerly=run_eagerly)
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=list(collections))
    weights = []

    class Before(keras.callbacks.Callback):  # the weights each training batch starts from
        def on_train_batch_begin(self, batch, logs=None):
            self.model.jax_state_sync()
            weights.append(self.model.get_layer("d1").get_weights()[0].copy())

    x = np.linspace(-1, 1, 48, dtype="float32").reshape(12, 4)
    y = np.linspace(0, 1, 24, dtype="float32").reshape(12, 2)
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, validation_data=(x[:8], y[:8]),
                        callbacks=[hook, Before()], verbose=0)
    predictions = model.predict(x[:8], batch_size=4, callbacks=[hook], verbose=0)
    hook.close()
    return create_trial(out_dir), weights, history, predictions


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["jit", "eager"])
def test_steps_modes_weights_losses_and_metrics(tmp_path, run_eagerly):
    trial, weights, history, predictions = fit_and_predict(str(tmp_path / "run"), run_eagerly)
    assert "tensorflow" not in sys.modules
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("TRAIN", 1), ("TRAIN", 2), ("EVAL", 0), ("EVAL", 1), ("PREDICT", 0), ("PREDICT", 1)]
    kernel = trial.tensor("d1/weights/net/d1/kernel")
    for step in (0, 1, 2):
        np.testing.assert_array_equal(kernel.value(step), weights[step])
    assert trial.tensor("loss").steps() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(trial.tensor("val_loss").value(4), history.history["val_loss"][0], rtol=1e-6)
    assert trial.tensor("mae").steps() == [0, 1, 2, 3, 4]


def test_gradients_under_jit_are_skipped_with_one_warning_each(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        trial, _, history, _ = fit_and_predict(str(tmp_path / "run"), run_eagerly=False)
    assert not trial.tensor_names(collection="gradients")
    warned = [r.getMessage() for r in caplog.records if "jax.jit-compiled" in r.getMessage()]
    assert sorted(m.split()[1] for m in warned) == [
        "gradients/net/d1/biasGrad", "gradients/net/d1/kernelGrad", "gradients/net/d2/biasGrad",
        "gradients/net/d2/kernelGrad"]
    assert len(history.history["loss"]) == 1  # training ran; the hook stayed on
    assert trial.tensor("d1/weights/net/d1/kernel").steps() == trial.steps()


def test_gradients_with_run_eagerly_are_the_sgd_update(tmp_path):
    trial, weights, _, _ = fit_and_predict(str(tmp_path / "run"), run_eagerly=True)
    grad = trial.tensor("gradients/net/d1/kernelGrad")
    assert grad.steps() == [0, 1, 2]
    for step in (0, 1):  # plain SGD: w(t+1) = w(t) - lr * g(t)
        np.testing.assert_allclose(weights[step + 1], weights[step] - LR * grad.value(step), rtol=1e-5, atol=1e-7)


def test_updates_with_run_eagerly_are_after_minus_before_and_skipped_under_jit_with_one_warning_each(
        tmp_path, caplog):
    collections = ("weights", "biases", "updates")
    trial, weights, _, _ = fit_and_predict(str(tmp_path / "eager"), run_eagerly=True, collections=collections)
    update = trial.tensor("update/d1/weights/net/d1/kernel")
    assert update.steps() == [0, 1, 2]
    for step in (0, 1):
        np.testing.assert_array_equal(update.value(step), weights[step + 1] - weights[step])
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        trial, _, history, _ = fit_and_predict(str(tmp_path / "jit"), run_eagerly=False, collections=collections)
    assert not trial.tensor_names(collection="updates")
    warned = [r.getMessage().split()[1] for r in caplog.records if "jax.jit-compiled" in r.getMessage()]
    assert sorted(warned) == ["update/d1/weights/net/d1/bias", "update/d1/weights/net/d1/kernel",
                              "update/d2/weights/net/d2/bias", "update/d2/weights/net/d2/kernel"]
    assert len(history.history["loss"]) == 1

"""KerasHook with model.fit / evaluate / predict: steps, modes and saved values."""
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug import reductions as reference  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

from conftest import make_model, make_recorder  # noqa: E402

ALL = ["weights", "biases", "gradients", "inputs", "outputs", "layers", "optimizer_variables"]
# 10 samples, batch 4 -> 3 TRAIN batches; 6 validation samples, batch 4 -> 2 EVAL batches;
# 2 epochs; then evaluate (batch 5 -> 2 EVAL) and predict (batch 5 -> 2 PREDICT).
TRAIN_STEPS = [0, 1, 2, 5, 6, 7]
EVAL_STEPS = [3, 4, 8, 9, 10, 11]
PREDICT_STEPS = [12, 13]


def batch_of(step, x, y):
    """The (x, y) batch of a global step of the scenario above (no shuffling)."""
    if step in TRAIN_STEPS:
        k = TRAIN_STEPS.index(step) % 3
        return x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]
    if step in (3, 4, 8, 9):
        k = (3, 4, 8, 9).index(step) % 2
        return x[4 * k:min(4 * k + 4, 6)], y[4 * k:min(4 * k + 4, 6)]
    k = (10, 11, 12, 13).index(step) % 2
    return x[5 * k:5 * k + 5], y[5 * k:5 * k + 5]


def run_scenario(model, hook, x, y, recorder=None):
    callbacks = [hook] + ([recorder] if recorder is not None else [])
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, validation_data=(x[:6], y[:6]), callbacks=callbacks,
              verbose=0)
    model.evaluate(x, y, batch_size=5, callbacks=callbacks, verbose=0)
    model.predict(x, batch_size=5, callbacks=callbacks, verbose=0)
    hook.close()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, data):
    """Every collection saved at every step of fit(+validation) + evaluate + predict."""
    x, y = data
    out = str(tmp_path_factory.mktemp("keras") / "run")
    model = make_model()
    hook = smd.KerasHook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=ALL)
    recorder = make_recorder()
    recorder.optimizer_name = "SGD"  # Keras named it "sgd" (or "sgd_<n>"): saved under its class name
    run_scenario(model, hook, x, y, recorder)
    return create_trial(out), recorder


def test_fit_evaluate_predict_steps_and_modes(full_run):
    trial, recorder = full_run
    assert trial.steps() == list(range(14))
    assert trial.steps(mode=smd.modes.TRAIN) == list(range(6))
    assert trial.steps(mode=smd.modes.EVAL) == list(range(6))
    assert trial.steps(mode=smd.modes.PREDICT) == [0, 1]
    for mode, globals_ in ((smd.modes.TRAIN, TRAIN_STEPS), (smd.modes.EVAL, EVAL_STEPS),
                           (smd.modes.PREDICT, PREDICT_STEPS)):
        assert [trial.global_step(mode, s) for s in range(len(globals_))] == globals_
    # Gradients and optimizer state exist only in TRAIN steps; losses in TRAIN and EVAL.
    assert trial.tensor("gradients/d1/kernelGrad").steps() == TRAIN_STEPS
    assert trial.tensor(f"{recorder.optimizer_name}/iteration").steps() == TRAIN_STEPS
    assert trial.tensor("loss").steps() == sorted(TRAIN_STEPS + EVAL_STEPS)
    # val_* logs of fit land in the last EVAL step of each validation run.
    assert trial.tensor("val_loss").steps() == [4, 9]


def test_default_config_saves_losses_and_metrics_at_step_zero_of_each_mode(tmp_path, data):
    x, y = data
    hook = smd.KerasHook(out_dir=tmp_path / "run")
    run_scenario(make_model(), hook, x, y)
    trial = create_trial(str(tmp_path / "run"))
    # TRAIN step 0 and EVAL step 0; PREDICT step 0 (12) has no losses, only the batch index.
    # Whatever the config, as 1.0.34 saved them: each epoch's training logs in its last TRAIN
    # step (2, 7), its val_* logs in its last validation step (4, 9).
    assert trial.steps() == [0, 2, 3, 4, 7, 9, 12]
    assert trial.mode_modestep(3) == (smd.modes.EVAL, 0)
    assert sorted(trial.tensor_names()) == ["batch", "loss", "mae", "val_loss", "val_mae"]
    assert trial.tensor_names(collection="losses") == ["loss", "val_loss"]
    assert trial.tensor_names(collection="metrics") == ["batch", "mae", "val_mae"]
    assert trial.tensor("loss").steps() == [0, 2, 3, 7]
    assert trial.tensor("val_loss").steps() == [4, 9]


def test_weights_equal_get_weights_before_each_batch(full_run):
    trial, recorder = full_run
    for step in range(14):
        kernel, bias = recorder.weights[step]["d1"]
        assert np.array_equal(trial.tensor("d1/weights/d1/kernel").value(step), kernel), step
        assert np.array_equal(trial.tensor("d1/weights/d1/bias").value(step), bias), step
    assert "d1/weights/d1/bias" in trial.tensor_names(collection="biases")
    assert "d1/weights/d1/bias" not in trial.tensor_names(collection="weights")
    assert "d2/weights/d2/kernel" in trial.tensor_names(collection="weights")


def test_losses_and_metrics_equal_keras_logs(full_run):
    trial, recorder = full_run
    for step in TRAIN_STEPS + EVAL_STEPS:
        assert trial.tensor("loss").value(step) == pytest.approx(recorder.logs[step]["loss"], rel=1e-7)
        assert trial.tensor("mae").value(step) == pytest.approx(recorder.logs[step]["mae"], rel=1e-7)
    for epoch, step in enumerate((4, 9)):
        assert trial.tensor("val_loss").value(step) == pytest.approx(recorder.epoch_logs[epoch]["val_loss"])


def test_gradients_equal_a_gradient_tape_on_the_same_batch(full_run, data):
    trial, recorder = full_run
    x, y = data
    reference_model = make_model(name_prefix="ref_")
    mse = keras.losses.MeanSquaredError()
    for step in TRAIN_STEPS:
        for layer, name in ((reference_model.get_layer("ref_d1"), "d1"), (reference_model.get_layer("ref_d2"), "d2")):
            layer.set_weights([trial.tensor(f"{name}/weights/{name}/kernel").value(step),
                               trial.tensor(f"{name}/weights/{name}/bias").value(step)])
        xb, yb = batch_of(step, x, y)
        with tf.GradientTape() as tape:
            loss = mse(yb, reference_model(xb))
        grads = tape.gradient(loss, reference_model.trainable_weights)
        saved = [trial.tensor(f"gradients/{n}Grad").value(step) for n in ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias")]
        for got, want in zip(saved, grads):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")


def test_layer_and_model_tensors(full_run, data):
    trial, recorder = full_run
    x, y = data
    for step in range(14):
        xb, yb = batch_of(step, x, y)
        kernel1, bias1 = (trial.tensor(f"d1/weights/d1/{n}").value(step) for n in ("kernel", "bias"))
        kernel2, bias2 = (trial.tensor(f"d2/weights/d2/{n}").value(step) for n in ("kernel", "bias"))
        hidden = np.maximum(xb @ kernel1 + bias1, 0)
        np.testing.assert_allclose(trial.tensor("d1/inputs").value(step), xb)
        np.testing.assert_allclose(trial.tensor("d1/outputs").value(step), hidden, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(trial.tensor("predictions").value(step), hidden @ kernel2 + bias2,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(trial.tensor("inputs").value(step), xb)
        if step not in PREDICT_STEPS:
            np.testing.assert_allclose(trial.tensor("labels").value(step), yb)
    assert set(trial.tensor_names(collection="layers")) == {"d1/inputs", "d1/outputs", "d2/inputs", "d2/outputs"}
    assert set(trial.tensor_names(collection="outputs")) == {"labels", "predictions"}
    assert trial.tensor_names(collection="inputs") == ["inputs"]
    assert f"{recorder.optimizer_name}/learning_rate" in trial.tensor_names(collection="optimizer_variables")


def test_add_keras_layer_and_reductions_match_reference(tmp_path, data):
    x, y = data
    model = make_model()
    reductions = ["min", "max", "mean", "std", "variance", "sum", "prod", "median"]
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "custom"],
                         reduction_config=smd.ReductionConfig(reductions=reductions, abs_reductions=["max"],
                                                              norms=["l1", "l2"], abs_norms=["l2"],
                                                              save_raw_tensor=True))
    hook.get_collection("custom").add_keras_layer(model.get_layer("d2"), inputs=False, outputs=True)
    model.fit(x, y, batch_size=5, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="custom") == ["d2/outputs"]
    assert "d1/outputs" not in trial.tensor_names()
    keys = [(r, False) for r in reductions] + [("l1", False), ("l2", False), ("max", True), ("l2", True)]
    for name in ("d2/outputs", "d1/weights/d1/kernel"):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            raw = tensor.value(step)
            saved = tensor.reduction_values(step)
            for key in keys:
                want = reference.reduce(raw, key[0], key[1])
                assert saved[key] == pytest.approx(float(want), rel=2e-5, abs=1e-6), (name, step, key)
    # TensorFlow keeps ":0" style names untouched in reduction tags; Keras paths have none.
    assert trial.tensor("d1/weights/d1/kernel").reduction_value(0, "l2") > 0


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "jit_compile"])
def test_reductions_only_of_weights_and_gradients_match_reference(tmp_path, data, jit_compile):
    """Without raw tensors, weights (read when a batch begins) and gradients (captured in the
    train step) are reduced together at the end of the step; a kernel bigger than
    SEGMENT_MAX_NUMEL takes the other reduction path. Values: a raw run of the same model."""
    from smdebug.tensorflow.backend import SEGMENT_MAX_NUMEL

    x = np.random.default_rng(1).standard_normal((10, 4)).astype("float32")
    y = np.random.default_rng(2).standard_normal((10, 2)).astype("float32")

    def model_and_run(path, raw):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,), name="x")
        wide = keras.layers.Dense(SEGMENT_MAX_NUMEL // 4 + 8, activation="relu", name="wide")(inputs)
        outputs = keras.layers.Dense(2, name="out")(wide)
        model = keras.Model(inputs, outputs, name="wide_net")
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=jit_compile)
        config = smd.ReductionConfig(reductions=["min", "max", "mean", "std", "sum"], abs_reductions=["mean"],
                                     norms=["l1", "l2"], save_raw_tensor=raw)
        hook = smd.KerasHook(out_dir=path, save_config=smd.SaveConfig(save_interval=2),
                             include_collections=["weights", "biases", "gradients"], reduction_config=config)
        model.fit(x, y, batch_size=5, epochs=2, shuffle=False, callbacks=[hook], verbose=0)
        hook.close()
        return create_trial(str(path))

    reduced = model_and_run(tmp_path / "reduced", raw=False)
    raw = model_and_run(tmp_path / "raw", raw=True)
    names = ["wide/weights/wide/kernel", "out/weights/out/bias", "gradients/wide/kernelGrad",
             "gradients/out/biasGrad"]
    keys = [(r, False) for r in ("min", "max", "mean", "std", "sum", "l1", "l2")] + [("mean", True)]
    assert reduced.steps() == [0, 1, 2, 3]  # 1 and 3 end the epochs: their logs only
    assert reduced.tensor(names[0]).steps() == [0, 2]
    for name in names:
        assert name in reduced.tensor_names()
        for step in (0, 2):
            value = raw.tensor(name).value(step)
            saved = reduced.tensor(name).reduction_values(step)
            for key in keys:
                want = float(reference.reduce(value, key[0], key[1]))
                assert saved[key] == pytest.approx(want, rel=2e-5, abs=1e-6), (name, step, key)


@pytest.mark.parametrize("compile_kwargs", [{"jit_compile": True}, {"run_eagerly": True}],
                         ids=["jit_compile", "run_eagerly"])
def test_gradients_under_xla_and_eager_execution(tmp_path, data, compile_kwargs):
    x, y = data
    model = make_model(**compile_kwargs)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=2),
                         include_collections=["weights", "biases", "gradients", "layers"])
    model.fit(x, y, batch_size=5, epochs=2, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("d1/weights/d1/kernel").steps() == [0, 2]  # 1 and 3 (ends of epochs): logs only
    reference_model = make_model(name_prefix="ref_")
    for step in (0, 2):
        for name in ("d1", "d2"):
            reference_model.get_layer(f"ref_{name}").set_weights(
                [trial.tensor(f"{name}/weights/{name}/{v}").value(step) for v in ("kernel", "bias")])
        xb, yb = x[(step % 2) * 5:(step % 2) * 5 + 5], y[(step % 2) * 5:(step % 2) * 5 + 5]
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(yb, reference_model(xb))
        want = tape.gradient(loss, reference_model.trainable_weights)[0].numpy()
        np.testing.assert_allclose(trial.tensor("gradients/d1/kernelGrad").value(step), want, rtol=1e-5, atol=1e-6)
        # Layer outputs have a static batch shape at the first trace: captured under XLA too.
        assert trial.tensor("d1/outputs").value(step).shape == (5, 3)


def test_hook_reused_across_fit_calls_continues_steps(tmp_path, data):
    x, y = data
    model = make_model()
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["gradients"])
    model.fit(x, y, batch_size=5, epochs=1, callbacks=[hook], verbose=0)
    model.fit(x, y, batch_size=5, epochs=1, callbacks=[hook], verbose=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    assert trial.tensor("gradients/d1/kernelGrad").steps() == [0, 1, 2, 3]
    # close() removed the wrappers: the model trains on without the hook.
    assert "apply" not in vars(model.optimizer)
    model.fit(x, y, batch_size=5, epochs=1, verbose=0)


def test_a_model_built_by_fit_saves_gradients_weights_and_optimizer_slots(tmp_path, data):
    # A Sequential without keras.Input is built by fit's first batch, its Adam slots by the
    # first update: both after set_model, where the hook looks for what to capture.
    x, y = data
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(3, activation="relu", name="d1"), keras.layers.Dense(2, name="d2")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "optimizer_variables"])
    model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    names = trial.tensor_names()
    grads = [n for n in names if n.startswith("gradients/")]
    assert len(grads) == 4 and all(trial.tensor(n).steps() == [0, 1, 2, 3] for n in grads), names
    kernels = [n for n in names if n.endswith("kernel") and not n.startswith(("gradients/", "adam"))]
    assert len(kernels) == 2 and all(trial.tensor(n).steps() == [0, 1, 2, 3] for n in kernels), names
    slots = [n for n in names if n.endswith(("_momentum", "_velocity"))]
    assert len(slots) == 8 and all(trial.tensor(n).steps() == [1, 2, 3] for n in slots), names


def test_val_logs_of_every_epoch_are_saved_whatever_the_save_interval(tmp_path, data):
    # 1.0.34 saved them at each epoch's end whatever the config: on most steps they would be lost.
    x, y = data
    model = make_model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=100),
                         include_collections=["losses", "metrics"])
    history = model.fit(x, y, batch_size=5, epochs=3, validation_data=(x, y), shuffle=False, verbose=0,
                        callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    val_loss = trial.tensor("val_loss")
    assert len(val_loss.steps()) == 3 and all(trial.mode(s) == smd.modes.EVAL for s in val_loss.steps())
    np.testing.assert_allclose([val_loss.value(s).item() for s in val_loss.steps()], history.history["val_loss"],
                               rtol=1e-5)
    assert len(trial.tensor("val_mae").steps()) == 3

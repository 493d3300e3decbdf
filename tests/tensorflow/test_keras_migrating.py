"""Keras scripts written against smdebug 1.0.34 run unchanged (docs/migrating.md)."""
import logging

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import smdebug.tensorflow as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

from conftest import make_model, make_recorder  # noqa: E402


def test_collection_with_its_own_reduction_config_in_compiled_fit(tmp_path, data, caplog):
    """1.0.34's docs: ``hook.get_collection("weights").reduction_config = ReductionConfig(...)``,
    here beside gradients saved whole (the hook's default config)."""
    x, y = data
    model = make_model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses"])
    hook.get_collection("weights").reduction_config = smd.ReductionConfig(norms=["l1"])
    recorder = make_recorder()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        model.fit(x, y, batch_size=5, epochs=1, shuffle=False, callbacks=[recorder, hook], verbose=0)
    hook.close()
    assert "disabled" not in caplog.text
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1]
    kernel = trial.tensor("d1/weights/d1/kernel")
    grad = trial.tensor("gradients/d1/kernelGrad")
    for step in (0, 1):
        want = np.abs(recorder.weights[step]["d1"][0]).sum()
        assert kernel.reduction_value(step, "l1") == pytest.approx(float(want), rel=1e-5)
        assert set(kernel.reduction_values(step)) == {("l1", False)}  # the collection's own config
        assert grad.value(step).shape == (4, 3)  # the hook's config: saved whole


def test_model_built_at_its_first_batch_saves_its_weights(tmp_path, caplog):
    """``Sequential([Dense(4), Dense(2)])`` without an Input builds inside fit's first batch."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(4, name="a"), keras.layers.Dense(2, name="b")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert not model.built
    x = np.random.default_rng(0).standard_normal((16, 3)).astype("float32")
    y = np.random.default_rng(1).standard_normal((16, 2)).astype("float32")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "losses"])
    recorder = make_recorder()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, callbacks=[recorder, hook], verbose=0)
    hook.close()
    assert "matched none" not in caplog.text
    trial = create_trial(str(tmp_path / "run"))
    weights = trial.tensor_names(collection="weights")
    assert len(weights) == 2 and len(trial.tensor_names(collection="biases")) == 2
    kernel = next(n for n in weights if n.startswith("a/") and n.endswith("kernel"))
    # Step 0 ran the build: its weights did not exist when it began, and are copied in its
    # train step (where the optimizer applies the gradients). Every step has the weights its
    # batch used (the recorder sees them from step 1 on: before step 0 there were none).
    steps = trial.tensor(kernel).steps()
    assert steps == [0, 1, 2, 3]
    assert recorder.weights[0] == {} and trial.tensor(kernel).value(0).shape == (3, 4)
    assert not np.allclose(trial.tensor(kernel).value(0), trial.tensor(kernel).value(1))
    for step in steps[1:]:
        np.testing.assert_allclose(trial.tensor(kernel).value(step), recorder.weights[step]["a"][0], rtol=1e-6)


def test_get_hook_takes_the_original_argument_order(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text('{"LocalPath": "%s"}' % (tmp_path / "run"))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    smd.del_hook()
    hook = smd.get_hook("keras", create_if_not_exists=True)  # (hook_type, json_config_path, create...)
    assert isinstance(hook, smd.KerasHook) and hook.out_dir == str(tmp_path / "run")
    assert smd.get_hook("keras", str(config), True) is hook
    smd.del_hook()
    assert smd.get_hook("keras") is None
    with pytest.raises(ConfigError, match="first argument is hook_type"):
        smd.get_hook(str(config))
    hook.close()


def test_epoch_values_come_from_the_last_saved_batch_of_each_epoch(tmp_path, data):
    """docs/migrating.md: 1.0.34 also wrote each epoch's logs at the epoch's end; here the
    last TRAIN batch of an epoch holds them (Keras 3's batch logs are running means), and
    val_* land in the last EVAL step."""
    x, y = data
    model = make_model()
    # 10 samples, batches of 5: TRAIN mode steps 1 and 3 end epochs 0 and 1.
    config = smd.SaveConfig(mode_save_configs={smd.modes.TRAIN: smd.SaveConfigMode(end_step=0, save_steps=[1, 3]),
                                               smd.modes.EVAL: smd.SaveConfigMode(save_interval=1)})
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=config)
    recorder = make_recorder()
    model.fit(x, y, batch_size=5, epochs=2, shuffle=False, validation_data=(x, y), callbacks=[recorder, hook],
              verbose=0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    loss = trial.tensor("loss")
    assert loss.steps(mode=smd.modes.TRAIN) == [1, 3]
    for epoch, mode_step in enumerate((1, 3)):
        logs = recorder.epoch_logs[epoch]
        assert loss.value(mode_step, mode=smd.modes.TRAIN).item() == pytest.approx(logs["loss"], rel=1e-6)
        assert trial.tensor("mae").value(mode_step, mode=smd.modes.TRAIN).item() == pytest.approx(logs["mae"],
                                                                                                   rel=1e-6)
    val_loss = trial.tensor("val_loss")
    assert [val_loss.value(s).item() for s in val_loss.steps()] == \
        pytest.approx([logs["val_loss"] for logs in recorder.epoch_logs], rel=1e-6)
    batch = trial.tensor("batch")  # the batch index within the epoch, a metric as in 1.0.34
    assert [int(batch.value(s, mode=smd.modes.TRAIN)) for s in (1, 3)] == [1, 1]


def test_save_scalar_after_fit_lands_in_the_last_step_of_fit(tmp_path, data):
    # AWS's scripts save a final metric after model.fit; 1.0.34 wrote it, in the step training ended on.
    x, y = data
    model = make_model()
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    model.fit(x, y, batch_size=5, epochs=2, verbose=0, callbacks=[hook])  # steps 0-3
    hook.save_scalar("final_accuracy", 0.75)
    model.evaluate(x, y, batch_size=5, verbose=0, callbacks=[hook])  # EVAL steps 4-5 after it
    hook.save_scalar("test_accuracy", 0.5)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("scalar/final_accuracy").steps() == [3]
    assert trial.tensor("scalar/final_accuracy").value(3).tolist() == [0.75]
    assert trial.tensor("scalar/test_accuracy").steps() == [5]
    assert "loss" in trial.tensor_names(step=3)  # the step's own records are still read


def test_a_small_sequential_saves_its_layers_weights_and_adams_state_only(tmp_path):
    # What each built-in collection holds for a small Sequential with Dropout (docs/migrating.md,
    # Keras 3): a seed generator's state is no weight; Adam's iteration and learning rate are
    # optimizer variables, as Keras 3 lists them.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(2)])
    model.compile("adam", "mse")
    hook = smd.KerasHook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "gradients", "optimizer_variables", "losses"])
    model.fit(np.ones((4, 4), "float32"), np.ones((4, 2), "float32"), epochs=1, batch_size=2, verbose=0,
              callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert not [n for n in trial.tensor_names() if "seed" in n.lower()]
    assert len(trial.tensor_names(collection="weights")) == 2 and len(trial.tensor_names(collection="biases")) == 2
    assert len(trial.tensor_names(collection="gradients")) == 4
    optimizer = trial.tensor_names(collection="optimizer_variables")  # "Adam/...", whatever Keras numbered it
    assert sorted(n.split("/", 1)[1] for n in optimizer if n.endswith(("/iteration", "/learning_rate"))) == [
        "iteration", "learning_rate"]
    assert len(optimizer) == 2 + 2 * 4
    assert trial.tensor_names(collection="losses") == ["loss"]

"""1.0.34-era Keras scripts, round 3 (issue 46): what their collections and steps hold.

Each test follows the behaviour of a public script (smdebug 1.0.34's tests/tensorflow2 and
AWS's examples/tensorflow2/scripts/tf2_save_metrics.py) on the model they train: Flatten,
Dense, Dropout, Dense. Where Keras 3 has other tensors than Keras 2 (Adam's variables), the
counts are Keras 3's (docs/migrating.md).
"""
import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras
import tensorflow as tf

import smdebug.tensorflow as smd
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial

BATCHES = 10
ADAM_VARIABLES = 2 + 2 * 4  # iteration, learning_rate; momentum and velocity of 2 kernels, 2 biases


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return rng.random((BATCHES * 32, 28, 28)).astype("float32"), rng.integers(0, 10, BATCHES * 32)


def mnist_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.2), keras.layers.Dense(10, activation="softmax")])


def fit_like_the_original(hook, images, stages=("train",)):
    """The original tests' helper: Adam wrapped by the hook, accuracy, 10 batches a stage."""
    x, y = images
    model = mnist_model()
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.Adam()), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    histories = []
    for stage in stages:
        if stage == "train":
            histories.append(model.fit(x, y, epochs=1, batch_size=32, callbacks=[hook], verbose=0))
        elif stage == "eval":
            model.evaluate(x, y, batch_size=32, callbacks=[hook], verbose=0)
        else:
            model.predict(x[:100], callbacks=[hook], verbose=0)
    hook.close()
    return histories


def test_metrics_collection_holds_accuracy_and_the_batch_index(tmp_path, images):
    # tf2_save_metrics.py: metrics=["accuracy"] gives 2 metrics; 1.0.34 added the batch index.
    out = str(tmp_path / "run")
    hook = smd.KerasHook(out, save_config=smd.SaveConfig(save_interval=3),
                         include_collections=["metrics", "losses"])
    fit_like_the_original(hook, images)
    trial = create_trial(out)
    assert trial.tensor_names(collection="metrics") == ["accuracy", "batch"]
    batch = trial.tensor("batch")
    assert batch.steps() == [0, 3, 6, 9]
    assert [int(batch.value(s)) for s in batch.steps()] == [0, 3, 6, 9]


def test_weights_collection_in_fit_saves_kernels_loss_and_two_metrics(tmp_path, images):
    # test_weights_collections / test_hook_from_json: 2 kernels, loss, accuracy, batch.
    out = str(tmp_path / "run")
    hook = smd.KerasHook(out, save_config=smd.SaveConfig(save_interval=3), include_collections=["weights"])
    fit_like_the_original(hook, images)
    trial = create_trial(out)
    assert len(trial.tensor_names()) == 5
    assert len(trial.tensor_names(collection="weights")) == 2
    assert trial.tensor_names(collection="biases") == []
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert len(trial.tensor_names(collection="metrics")) == 2


def test_save_tensor_before_fit_and_each_epochs_training_logs(tmp_path, images):
    # test_save_tensors: the default interval (500) saves TRAIN step 0; 1.0.34 also wrote each
    # epoch's training logs at its end: TRAIN steps 0, 9 (end of the first fit) and 19.
    out = str(tmp_path / "run")
    hook = smd.KerasHook(out_dir=out, include_collections=["custom_coll"])
    hook.save_tensor("custom_tensor_1", tf.constant([0, 1, 1, 2, 3, 5, 8]), ["custom_coll"])
    hook.save_tensor("custom_tensor_2", tf.Variable([5 + 4j, 6 + 1j]), ["custom_coll"])
    hook.save_tensor("custom_tensor_3", tf.Variable([False, True]), ["custom_coll"])
    histories = fit_like_the_original(hook, images, ("train", "eval", "predict", "train"))
    trial = create_trial(out)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, BATCHES - 1, 2 * BATCHES - 1]
    assert sorted(trial.tensor_names(collection="custom_coll")) == [f"custom_tensor_{i}" for i in (1, 2, 3)]
    assert trial.tensor("custom_tensor_3").value(0).tolist() == [False, True]
    loss = trial.tensor("loss")
    for mode_step, history in zip((BATCHES - 1, 2 * BATCHES - 1), histories):
        assert loss.value(mode_step, mode=ModeKeys.TRAIN).item() == pytest.approx(history.history["loss"][0],
                                                                                   rel=1e-5)


def test_custom_collection_of_adams_variables_alone(tmp_path, images):
    # test_include_only_custom_collection: include("Adam") selects the optimizer's variables, named
    # after its class as in Keras 2; Keras 3's Adam has 10 of them here (1.0.34's Keras 2 Adam: 5).
    out = str(tmp_path / "run")
    hook = smd.KerasHook(out, save_config=smd.SaveConfig(save_interval=3),
                         include_collections=["custom_optimizer_variables"],
                         reduction_config=smd.ReductionConfig(norms=["l1", "l2"], reductions=["min", "max"]))
    hook.get_collection("custom_optimizer_variables").include("Adam")
    fit_like_the_original(hook, images, ("train", "eval", "predict"))
    trial = create_trial(out)
    custom = trial.tensor_names(collection="custom_optimizer_variables")
    assert len(custom) == ADAM_VARIABLES
    assert all(name.startswith("Adam/") for name in custom)
    assert "Adam/iteration" in custom
    assert sorted(set(trial.tensor_names()) - set(custom)) == ["accuracy", "batch", "loss"]
    assert trial.tensor("Adam/iteration").reduction_value(3, "l1", abs=False) == 3


def test_optimizer_name_chosen_by_the_user_is_kept(tmp_path, images):
    out = str(tmp_path / "run")
    hook = smd.KerasHook(out, include_collections=["optimizer_variables"])
    x, y = images
    model = mnist_model()
    model.compile(optimizer=keras.optimizers.Adam(name="encoder_opt"), loss="sparse_categorical_crossentropy")
    model.fit(x[:64], y[:64], batch_size=32, callbacks=[hook], verbose=0)
    hook.close()
    assert "encoder_opt/iteration" in create_trial(out).tensor_names(collection="optimizer_variables")


def _tape_loop(hook, images, tf_function=False, save_inputs=True):
    """The original's GradientTape scripts: gradients of model.variables, which in Keras 3
    also lists the Dropout's seed generator state."""
    x, y = images
    model = mnist_model()
    optimizer = keras.optimizers.Adam()
    hook.wrap_optimizer(optimizer)
    dataset = tf.data.Dataset.from_tensor_slices((x[:128], y[:128])).batch(32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    accuracy = keras.metrics.SparseCategoricalAccuracy()

    def forward(data, labels):
        return loss_fn(labels, model(data, training=True))

    if tf_function:
        forward = tf.function(forward)
    for data, labels in dataset:
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = forward(data, labels)
        grads = tape.gradient(loss, model.variables)
        optimizer.apply_gradients(zip(grads, model.variables))
        if save_inputs:
            hook.save_tensor("inputs", data, "inputs")
        else:
            hook.save_tensor("accuracy", accuracy(labels, model(data)), "metrics")
    hook.close()


@pytest.mark.parametrize("tf_function", [False, True])
def test_gradient_tape_weights_hold_no_rng_state(tmp_path, images, tf_function):
    # test_gradtape_tf_function / test_keras_gradtape with save_all: 2 kernels, 2 biases.
    out = str(tmp_path / "run")
    _tape_loop(smd.KerasHook(out, save_all=True), images, tf_function)
    trial = create_trial(out)
    assert not [name for name in trial.tensor_names() if "seed" in name]
    assert len(trial.tensor_names(collection="weights")) == 2
    assert len(trial.tensor_names(collection="biases")) == 2
    assert len(trial.tensor_names(collection="gradients")) == 4
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert trial.tensor_names(collection="inputs") == ["inputs"]


def test_gradient_tape_weights_collection_alone(tmp_path, images):
    # test_gradtape_weights_collections: 2 kernels, the loss and the accuracy the script saves.
    out = str(tmp_path / "run")
    _tape_loop(smd.KerasHook(out, save_config=smd.SaveConfig(save_interval=3), include_collections=["weights"]),
               images, save_inputs=False)
    trial = create_trial(out)
    assert sorted(trial.tensor_names()) == ["accuracy", "loss"] + sorted(trial.tensor_names(collection="weights"))
    assert len(trial.tensor_names(collection="weights")) == 2

"""MirroredStrategy over two logical CPUs: one replica's values, named after its device."""
import json
import os

import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

CHIEF = "_job-localhost_replica-0_task-0_device-CPU-0"


@pytest.fixture
def strategy(mirrored_strategy):
    return mirrored_strategy


def mirrored_model(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d1")], name="mirrored")
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def test_fit_saves_the_chief_replica_under_its_device_name(tmp_path, strategy):
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((16, 4)).astype("float32"), rng.standard_normal((16, 2)).astype("float32")
    model = mirrored_model(strategy)
    out = tmp_path / "run"
    hook = smd.KerasHook(out_dir=out, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "gradients"])
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()

    # docs/format.md 1.2: the worker is the serialized device; file names get a double underscore.
    assert os.listdir(out / "collections" / "000000000") == [f"{CHIEF}_collections.json"]
    # docs/format.md 10.1: the run store's partition folder holds the serialized device name too.
    assert os.listdir(out / "store" / "tensors") == [f"worker={CHIEF}"]
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1]
    assert trial.workers() == ["/job:localhost/replica:0/task:0/device:CPU:0"]

    reference = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="ref")])
    for step in (0, 1):
        kernel = trial.tensor("d1/weights/mirrored/d1/kernel").value(step)
        bias = trial.tensor("d1/weights/mirrored/d1/bias").value(step)
        reference.layers[0].set_weights([kernel, bias])
        # The chief replica computes on the first half of the global batch; Keras scales each
        # replica's loss by 1/num_replicas so that the all-reduced sum is the batch mean.
        xb, yb = x[8 * step:8 * step + 4], y[8 * step:8 * step + 4]
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(yb, reference(xb)) / strategy.num_replicas_in_sync
        want = tape.gradient(loss, reference.trainable_weights)[0].numpy()
        np.testing.assert_allclose(trial.tensor("gradients/mirrored/d1/kernelGrad").value(step), want,
                                   rtol=1e-5, atol=1e-6)


def test_hook_made_in_the_strategy_scope_takes_the_device_name(tmp_path, strategy, caplog):
    with strategy.scope():
        with caplog.at_level("WARNING", logger="smdebug"):
            hook = smd.KerasHook(out_dir=tmp_path / "run", include_workers="all")
    assert hook.worker_name == CHIEF
    # One writer per process: "all" would announce two workers and leave the reader waiting.
    assert hook.include_workers == "one" and "not supported with MirroredStrategy" in caplog.text
    assert json.loads(hook.collections_json())["_meta"] == {"num_workers": 1}
    hook.close()


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "reduced_in_graph"])
def test_fit_weights_from_the_chief_replica_train_step_equal_get_weights(tmp_path, strategy, raw):
    # After the first step the trainable weights come from the optimizer's site in the
    # chief replica's graph (no read at step begin); they must still be the batch's weights.
    # Reductions only: computed in the chief replica's train step (capture REDUCE mode).
    from conftest import make_recorder

    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((32, 4)).astype("float32"), rng.standard_normal((32, 2)).astype("float32")
    model = mirrored_model(strategy)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases"],
                         reduction_config=smd.ReductionConfig(save_raw_tensor=True) if raw else
                         smd.ReductionConfig(reductions=["max"], norms=["l2"]))
    reads = {}
    read = hook._read_variables

    def counting(variables):
        reads[hook.global_step] = len(variables)
        return read(variables)

    hook._read_variables = counting
    recorder = make_recorder()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook, recorder], verbose=0)
    hook.close()
    assert sorted(reads) == [0]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    for step in range(4):
        kernel, bias = recorder.weights[step]["d1"]
        for name, value in (("d1/weights/mirrored/d1/kernel", kernel), ("d1/weights/mirrored/d1/bias", bias)):
            if raw:
                assert np.array_equal(trial.tensor(name).value(step), value), step
            else:
                assert trial.tensor(name).reduction_value(step, "max") == float(value.max()), step
                assert trial.tensor(name).reduction_value(step, "l2") == \
                    pytest.approx(float(np.linalg.norm(value)), rel=1e-6), step

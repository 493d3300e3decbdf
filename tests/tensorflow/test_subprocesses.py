"""Runs in fresh interpreters: KERAS_BACKEND=torch, and zero-code-change on unmodified scripts."""
import importlib.util
import json
import os
import textwrap

import pytest

pytest.importorskip("tensorflow")

import numpy as np

import smdebug.tensorflow as smd
from smdebug.trials import create_trial

from conftest import run_python

# An unmodified training script: nothing in it knows about smdebug.
SCRIPT = textwrap.dedent("""
    import numpy as np
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d1")], name="plain")
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x = np.linspace(-1, 1, 48, dtype="float32").reshape(12, 4)
    y = np.linspace(0, 1, 24, dtype="float32").reshape(12, 2)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.evaluate(x, y, batch_size=6, verbose=0)
""")


def write_config(path, out_dir, collections=("weights", "gradients")):
    path.write_text(json.dumps({
        "LocalPath": str(out_dir),
        "HookParameters": {"save_interval": "1"},
        "CollectionConfigurations": [{"CollectionName": c} for c in collections],
    }))
    return str(path)


def check_zcc_run(out_dir):
    trial = create_trial(str(out_dir))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1]
    assert trial.tensor("gradients/plain/d1/kernelGrad").steps() == [0, 1, 2]
    assert set(trial.tensor_names()) >= {"loss", "mae", "d1/weights/plain/d1/kernel"}
    assert os.path.exists(os.path.join(out_dir, "training_job_end.ts"))


def test_keras_hook_with_the_torch_backend(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import keras
        import smdebug.tensorflow as smd

        # (no keras.utils.set_random_seed: it imports TensorFlow to seed it)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d1")], name="net")
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        hook = smd.KerasHook(out_dir={str(out)!r}, save_config=smd.SaveConfig(save_interval=1),
                             include_collections=["weights", "biases", "gradients", "outputs", "updates"])
        weights = []
        class Before(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                weights.append(self.model.layers[0].get_weights()[0].copy())
        x = np.linspace(-1, 1, 32, dtype="float32").reshape(8, 4)
        y = np.linspace(0, 1, 16, dtype="float32").reshape(8, 2)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, validation_data=(x, y), callbacks=[hook, Before()],
                  verbose=0)
        model.predict(x, batch_size=4, callbacks=[hook], verbose=0)
        hook.close()
        np.save({str(tmp_path / "weights.npy")!r}, np.stack(weights))
        print("backend", keras.backend.backend(), "tensorflow imported", "tensorflow" in sys.modules)
    """)
    result = run_python(code, env={"KERAS_BACKEND": "torch"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend torch tensorflow imported False" in result.stdout
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 2, 3, 4, 5]
    assert [trial.mode_modestep(s)[0].name for s in trial.steps()] == ["TRAIN"] * 2 + ["EVAL"] * 2 + ["PREDICT"] * 2
    weights = np.load(tmp_path / "weights.npy")
    for step in (0, 1):
        np.testing.assert_array_equal(trial.tensor("d1/weights/net/d1/kernel").value(step), weights[step])
    assert trial.tensor("gradients/net/d1/kernelGrad").steps() == [0, 1]
    # the optimizer's apply runs eagerly: the update of step 0 is the weights of step 1 minus those of step 0
    assert trial.tensor("update/d1/weights/net/d1/kernel").steps() == [0, 1]
    np.testing.assert_array_equal(trial.tensor("update/d1/weights/net/d1/kernel").value(0), weights[1] - weights[0])
    assert trial.tensor("val_loss").steps() == [3]
    assert trial.tensor("predictions").value(5).shape == (4, 2)


def test_instrument_attaches_the_configured_hook_and_use_smdebug_0_turns_it_off(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    on, off = tmp_path / "on", tmp_path / "off"
    config_on = write_config(tmp_path / "on.json", on)
    config_off = write_config(tmp_path / "off.json", off)
    code = textwrap.dedent(f"""
        import os, runpy
        from smdebug.tensorflow import _instrument
        import smdebug.tensorflow as smd

        _instrument.instrument()
        _instrument.instrument()  # idempotent
        runpy.run_path({str(script)!r}, run_name="__main__")
        smd.get_hook().close()

        os.environ["SMDEBUG_CONFIG_FILE_PATH"] = {config_off!r}
        os.environ["USE_SMDEBUG"] = "0"
        runpy.run_path({str(script)!r}, run_name="__main__")
        _instrument.uninstrument()
        import keras
        assert not hasattr(keras.Model.fit, "_smdebug_original")
        print("done")
    """)
    result = run_python(code, env={"SMDEBUG_CONFIG_FILE_PATH": config_on})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done" in result.stdout
    check_zcc_run(on)
    assert not off.exists()


def test_zero_code_change_bootstrap_instruments_an_unmodified_script(tmp_path):
    if importlib.util.find_spec("smdebug.capture.zero_code_change") is None:
        pytest.skip("the zero-code-change bootstrap is not available")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    config = write_config(tmp_path / "config.json", out)
    # What the .pth line does at interpreter start, then the script, unmodified.
    code = f"import smdebug.capture.zero_code_change, runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    result = run_python(code, env={"SMDEBUG_CONFIG_FILE_PATH": config})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "smdebug:" not in result.stderr, result.stderr[-2000:]  # no warning from the bootstrap or the hook
    check_zcc_run(out)


# AWS's examples/tensorflow/*/simple.py, in a process where eager execution is off: a
# resource-variable global step, the hook from the JSON config SageMaker writes.
GRAPH_MODE_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import smdebug.tensorflow as smd

    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(shape=(None, 2), dtype=tf.float32)
    w = tf.Variable(initial_value=[[10.0], [10.0]], name="weight1")
    loss = tf.reduce_mean((tf.matmul(x, w) - tf.matmul(x, [[1.0], [1.0]])) ** 2, name="loss")
    hook = smd.SessionHook.create_from_json_file()
    hook.add_to_collection("losses", loss)
    global_step = tf.Variable(17, name="global_step", trainable=False)
    increment_global_step_op = tf.compat.v1.assign(global_step, global_step + 1)
    optimizer = hook.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(0.01))
    optimizer_op = optimizer.minimize(loss, global_step=increment_global_step_op)
    sess = tf.compat.v1.train.MonitoredSession(hooks=[hook])
    hook.set_mode(smd.modes.TRAIN)
    rng = np.random.default_rng(0)
    for i in range(4):
        sess.run([loss, optimizer_op, increment_global_step_op], {x: rng.random((10, 2))})
    hook.set_mode(smd.modes.EVAL)
    for i in range(3):
        sess.run([loss, increment_global_step_op], {x: rng.random((10, 2))})
    sess.close()
    hook.close()
""")


def test_graph_mode_script_with_a_resource_variable_global_step(tmp_path):
    config = write_config(tmp_path / "config.json", tmp_path / "run",
                          collections=("weights", "gradients", "losses", "optimizer_variables"))
    result = run_python(GRAPH_MODE_SCRIPT, env={"SMDEBUG_CONFIG_FILE_PATH": config})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hook disabled" not in result.stderr, result.stderr[-3000:]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1, 2]
    assert trial.tensor("loss:0").steps() == list(range(7))
    assert trial.tensor("gradients/weight1Grad").steps() == [0, 1, 2, 3]
    # The global step counts 17, 18... and is read before each step's run (two increments a TRAIN step).
    assert [int(trial.tensor("global_step:0").value(s)) for s in range(3)] == [17, 19, 21]
    assert "weight1:0" in trial.tensor_names(collection="weights")

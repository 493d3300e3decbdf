"""Shared helpers for the TensorFlow adapter tests: tiny models, a recording callback.

TensorFlow is imported lazily: every test module starts with
``pytest.importorskip("tensorflow")``. Two logical CPU devices are configured as soon as
TensorFlow is first imported here (before it initialises its devices), for the
MirroredStrategy test.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _configure_tensorflow():
    try:
        import tensorflow as tf
    except ImportError:
        return
    try:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:  # devices already initialised by someone else: the mirrored test skips
        pass


_configure_tensorflow()


def make_model(name_prefix="", seed=0, optimizer=None, **compile_kwargs):
    """Input(4) -> Dense(3, relu, 'd1') -> Dense(2, 'd2'), SGD(0.1), mse, mae."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(3, activation="relu", name=f"{name_prefix}d1")(inputs)
    outputs = keras.layers.Dense(2, name=f"{name_prefix}d2")(hidden)
    model = keras.Model(inputs, outputs, name=f"{name_prefix}net")
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"], **compile_kwargs)
    return model


@pytest.fixture(scope="session")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype("float32")
    y = rng.standard_normal((10, 2)).astype("float32")
    return x, y


@pytest.fixture(scope="session")
def mirrored_strategy():
    """The process's one MirroredStrategy over two logical CPUs: a second instance in the same
    process issues collectives whose instance keys collide with the first's (TensorFlow then
    aborts them with a shape mismatch)."""
    import tensorflow as tf
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("TensorFlow devices were initialised before two logical CPUs could be configured")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def make_recorder():
    """A Keras callback keeping, per global batch, the weights before it and its logs."""
    import keras

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights = []  # per global step: {layer name: [kernel, bias]}
            self.logs = []  # per global step
            self.epoch_logs = []

        def _begin(self, batch, logs=None):
            self.weights.append({layer.name: [w.copy() for w in layer.get_weights()]
                                 for layer in self.model.layers if layer.get_weights()})

        def _end(self, batch, logs=None):
            self.logs.append(dict(logs or {}))

        on_train_batch_begin = on_test_batch_begin = on_predict_batch_begin = _begin
        on_train_batch_end = on_test_batch_end = on_predict_batch_end = _end

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_logs.append(dict(logs or {}))

    return Recorder()


def run_python(code, env=None, timeout=240, cwd=None):
    """Run ``code`` in a fresh interpreter of this venv; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout)

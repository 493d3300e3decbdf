"""SessionHook (tf.compat.v1 + MonitoredSession), EstimatorHook, get_hook and the module's API."""
import pytest

tf = pytest.importorskip("tensorflow")

import numpy as np  # noqa: E402

import smdebug  # noqa: E402
import smdebug.tensorflow as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def build_graph():
    x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
    y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
    kernel = tf.compat.v1.get_variable("dense/kernel", [3, 1], initializer=tf.compat.v1.constant_initializer(0.5))
    bias = tf.compat.v1.get_variable("dense/bias", [1], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, kernel) + bias)
    grads = tf.gradients(loss, [kernel, bias])
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=global_step)
    return x, y, kernel, loss, grads, train


def test_session_hook_saves_weights_gradients_losses_with_monitored_session(tmp_path):
    rng = np.random.default_rng(0)
    X, Y = rng.random((12, 3)).astype("float32"), rng.random((12, 1)).astype("float32")
    with tf.Graph().as_default():
        x, y, kernel, loss, grads, train = build_graph()
        hook = smd.SessionHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=2),
                               include_collections=["weights", "biases", "gradients", "losses",
                                                    "optimizer_variables"])
        hook.set_mode(smd.modes.TRAIN)
        seen = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for i in range(5):
                feed = {x: X[2 * i:2 * i + 2], y: Y[2 * i:2 * i + 2]}
                seen.append(sess.run([kernel, loss], feed))  # steps 0, 2, 4...: saved
                sess.run(train, feed)  # steps 1, 3, 5...: not saved
        hook.close()
    trial = create_trial(str(tmp_path / "run"))
    # Each session.run is a step; with save_interval 2 the saved ones are the first run of each pair.
    assert trial.steps() == [0, 2, 4, 6, 8]
    for i, step in enumerate(trial.steps()):
        before, step_loss = seen[i]
        np.testing.assert_array_equal(trial.tensor("dense/kernel:0").value(step), before)
        assert trial.tensor("mean_squared_error/value:0").value(step).item() == pytest.approx(float(step_loss))
    assert set(trial.tensor_names(collection="weights")) == {"dense/kernel:0"}
    assert set(trial.tensor_names(collection="biases")) == {"dense/bias:0"}
    assert "global_step:0" in trial.tensor_names(collection="optimizer_variables")
    assert "dense/kernel/Adam:0" in trial.tensor_names(collection="optimizer_variables")
    assert trial.tensor_names(collection="gradients") == ["gradients/dense/biasGrad", "gradients/dense/kernelGrad"]


def test_session_hook_gradient_is_the_one_applied(tmp_path):
    rng = np.random.default_rng(1)
    X, Y = rng.random((8, 3)).astype("float32"), rng.random((8, 1)).astype("float32")
    with tf.Graph().as_default():
        x, y, kernel, loss, grads, train = build_graph()
        hook = smd.SessionHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                               include_collections=["weights", "gradients"])
        expected = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            raw = sess._tf_sess()  # the session under the hooks: probing it is not a step
            for i in range(3):
                feed = {x: X[2 * i:2 * i + 2], y: Y[2 * i:2 * i + 2]}
                expected.append((raw.run(kernel), raw.run(grads[0], feed)))
                sess.run(train, feed)
        hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2]
    for step, (kernel_before, grad) in enumerate(expected):
        np.testing.assert_array_equal(trial.tensor("dense/kernel:0").value(step), kernel_before)
        np.testing.assert_allclose(trial.tensor("gradients/dense/kernelGrad").value(step), grad, rtol=1e-6)


@pytest.mark.parametrize("hook_name, hook_type", [("SessionHook", "session"), ("EstimatorHook", "estimator")])
def test_session_hook_saves_graph_tensors_matching_include_regex(tmp_path, hook_name, hook_type):
    """Also under 1.0.34's name EstimatorHook, which its local example runs with MonitoredSession."""
    assert smd.EstimatorHook is smd.SessionHook
    with tf.Graph().as_default():
        x, y, kernel, loss, grads, train = build_graph()
        hook = getattr(smd, hook_name)(out_dir=tmp_path / "run", include_regex=["^MatMul:0$"])
        feed = {x: np.ones((2, 3), np.float32), y: np.zeros((2, 1), np.float32)}
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train, feed)
        assert smd.get_hook(hook_type=hook_type) is hook
        hook.close()
    trial = create_trial(str(tmp_path / "run"))
    np.testing.assert_allclose(trial.tensor("MatMul:0").value(0), np.full((2, 1), 1.5))
    # The profile's own regexes ("^gradient") do not pull in TensorFlow's gradient ops.
    assert sorted(trial.tensor_names()) == ["MatMul:0", "mean_squared_error/value:0"]


def test_get_hook_singleton_and_json_config(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text('{"LocalPath": "%s", "HookParameters": {"save_interval": "3"}}' % (tmp_path / "zcc"))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    with pytest.raises(ConfigError, match="hook_type must be one of keras, session, estimator"):
        smd.get_hook(hook_type="kears")
    hook = smd.get_hook(hook_type="keras", create_if_not_exists=True)
    assert isinstance(hook, smd.KerasHook) and hook.out_dir == str(tmp_path / "zcc")
    assert smd.get_hook() is hook and smd.get_hook(hook_type="keras") is hook
    assert smd.get_hook(hook_type="session") is None
    monkeypatch.setenv("USE_SMDEBUG", "0")
    assert smd.get_hook(hook_type="keras", create_if_not_exists=True) is None
    hook.close()


def test_module_exports_are_the_core_objects():
    for name in ("SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionKeys", "ModeKeys",
                 "modes"):
        assert getattr(smd, name) is getattr(smdebug, name), name
    assert smd.modes.TRAIN is smdebug.ModeKeys.TRAIN
    for name in ("KerasHook", "SessionHook", "EstimatorHook", "get_hook"):
        assert callable(getattr(smd, name))


def test_session_hook_with_a_resource_variable_global_step_saves(tmp_path):
    rng = np.random.default_rng(2)
    X, Y = rng.random((8, 3)).astype("float32"), rng.random((8, 1)).astype("float32")
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        kernel = tf.compat.v1.get_variable("dense/kernel", [3, 1], use_resource=True)
        loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, kernel))
        global_step = tf.compat.v1.Variable(0, trainable=False, name="global_step", dtype=tf.int64, use_resource=True,
                                            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                                                         tf.compat.v1.GraphKeys.GLOBAL_STEP])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
        hook = smd.SessionHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                               include_collections=["weights", "losses", "optimizer_variables"])
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for i in range(4):
                sess.run(train, {x: X[2 * i:2 * i + 2], y: Y[2 * i:2 * i + 2]})
        hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    assert [trial.tensor("global_step:0").value(s).item() for s in range(4)] == [0, 1, 2, 3]
    assert "dense/kernel:0" in trial.tensor_names(collection="weights")

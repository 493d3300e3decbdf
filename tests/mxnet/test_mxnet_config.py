"""JSON configuration, the process's hook (get_hook) and zero-code-change instrumentation."""
import json

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import smdebug.mxnet as smd  # noqa: E402
from smdebug.mxnet import _instrument  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def write_config(tmp_path, run_dir, **hook_parameters):
    config = {
        "LocalPath": run_dir,
        "HookParameters": {"save_interval": "2", **hook_parameters},
        "CollectionConfigurations": [
            {"CollectionName": "weights", "CollectionParameters": {"reductions": "mean,abs_max,l2_norm"}},
            {"CollectionName": "gradients", "CollectionParameters": {"save_steps": "1"}},
        ],
    }
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_create_from_json_file(tmp_path, run_dir, make_net, train):
    hook = smd.Hook.create_from_json_file(write_config(tmp_path, run_dir))
    assert isinstance(hook, smd.Hook)
    net, loss_fn, trainer = make_net()
    hook.register_block(net)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    seen = train(net, loss_fn, trainer, 4,
                 observe=lambda stage, step: net[1].weight.data().asnumpy().copy() if stage == "after" else None)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]  # interval 2, plus the gradients' save_steps "1" (a union)
    weight = trial.tensor("dense1_weight")
    assert weight.steps() == [0, 2]
    reductions = weight.reduction_values(2)
    assert set(reductions) == {("mean", False), ("max", True), ("l2", False)}
    np.testing.assert_allclose(reductions[("max", True)], np.abs(seen[2]["after"]).max(), rtol=1e-6)
    assert trial.tensor("gradient/dense1_weight").steps() == [0, 1, 2]
    assert trial.tensor("softmaxcrossentropyloss0_output_0").steps() == [0, 2]  # losses: always included


def test_get_hook_creates_from_env_and_returns_the_same_hook(tmp_path, run_dir, monkeypatch):
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)
    assert smd.get_hook(json_config_path=str(tmp_path / "missing.json"), create_if_not_exists=True) is None
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, run_dir))
    assert smd.get_hook() is None  # nothing created unless asked
    hook = smd.get_hook(create_if_not_exists=True)
    assert isinstance(hook, smd.Hook) and hook.out_dir == run_dir
    assert smd.get_hook(create_if_not_exists=True) is hook
    hook.close()
    assert smd.get_hook() is None
    by_hand = smd.Hook(str(tmp_path / "by_hand"))
    assert smd.get_hook() is by_hand  # a hook made by hand is the process's hook
    by_hand.close()


@pytest.fixture
def instrumented():
    _instrument.instrument()
    _instrument.instrument()  # idempotent
    yield
    _instrument.uninstrument()
    hook = smd.get_hook()
    if hook is not None:
        hook.close()


def test_zero_code_change_attaches_to_an_unmodified_script(tmp_path, run_dir, monkeypatch, instrumented, data):
    from mxnet import autograd, gluon

    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, run_dir))
    # The script, unchanged: no smdebug in it.
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    net[1].initialize(mx.init.One(), force_reinit=True)  # a re-initialized head must not win over the net
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x, y = data
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)

    hook = smd.get_hook()
    assert hook is not None and hook.model is net and hook._losses == [loss_fn]
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    assert {"dense0_weight", "dense1_weight", "gradient/dense0_weight",
            "softmaxcrossentropyloss0_output_0"} <= set(trial.tensor_names())


def test_zero_code_change_finds_a_net_initialized_through_collect_params(tmp_path, run_dir, monkeypatch,
                                                                          instrumented, data):
    from mxnet import autograd, gluon

    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, run_dir))
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.collect_params().initialize(mx.init.Xavier())  # as AWS's MNIST example does
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x, y = data
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
    hook = smd.get_hook()
    assert hook is not None and hook.model is net
    hook.close()
    assert {"dense0_weight", "gradient/dense0_weight"} <= set(create_trial(run_dir).tensor_names())


def test_zero_code_change_defers_to_the_hook_the_script_creates_itself(tmp_path, run_dir, monkeypatch,
                                                                       instrumented, data):
    # A 1.0.34 script builds its loss, then calls create_from_json_file() and set_mode itself:
    # one hook, the script's, saves, with the script's modes.
    from mxnet import autograd, gluon

    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, run_dir, save_interval="1"))
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook = smd.Hook.create_from_json_file()
    hook.register_block(net)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x, y = data
    hook.set_mode(smd.modes.TRAIN)
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
    hook.set_mode(smd.modes.EVAL)
    for _ in range(2):
        loss_fn(net(x), y)
    assert smd.get_hook() is hook and hook._losses == [loss_fn]
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1, 2] and trial.steps(mode=smd.modes.EVAL) == [0, 1]
    assert trial.tensor("softmaxcrossentropyloss0_output_0").steps() == [0, 1, 2, 3, 4]
    assert trial.workers() == ["worker_0"] or len(trial.workers()) == 1


def test_zero_code_change_without_config_attaches_nothing(monkeypatch, instrumented, data):
    from mxnet import gluon

    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", "/nonexistent/smdebug-config.json")
    net = gluon.nn.Dense(2)
    net.initialize()
    gluon.loss.L2Loss()
    gluon.Trainer(net.collect_params(), "sgd")
    net(data[0])
    assert smd.get_hook() is None
    assert not net._forward_pre_hooks


def test_uninstrument_restores_gluon():
    from mxnet import gluon

    originals = (gluon.Block.initialize, gluon.Block.load_parameters, gluon.Trainer.__init__,
                 gluon.loss.Loss.__init__)
    _instrument.instrument()
    assert _instrument.is_instrumented() and gluon.Trainer.__init__ is not originals[2]
    _instrument.uninstrument()
    assert not _instrument.is_instrumented()
    assert (gluon.Block.initialize, gluon.Block.load_parameters, gluon.Trainer.__init__,
            gluon.loss.Loss.__init__) == originals


def test_autoencoder_notebook_hook_made_after_the_trainer_saves_eval_steps(tmp_path, run_dir, monkeypatch,
                                                                           instrumented):
    # AWS's MXNet autoencoder example: the Trainer comes first (zero code change makes the config's
    # hook there), then the script asks for the hook itself, sets EVAL and runs forward passes
    # outside autograd.record(); the notebook reads the bottleneck's output at EVAL steps.
    from mxnet import autograd, gluon

    config = {"LocalPath": run_dir, "HookParameters": {"save_interval": "1"},
              "CollectionConfigurations": [
                  {"CollectionName": "bottleneck",
                   "CollectionParameters": {"include_regex": ".*hybridsequential0_dense0_output_0"}}]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "config.json"))

    class ConvolutionalAutoencoder(gluon.nn.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.encoder = gluon.nn.HybridSequential()
                with self.encoder.name_scope():
                    self.encoder.add(gluon.nn.Conv2D(4, 3, activation="relu"), gluon.nn.MaxPool2D(2),
                                     gluon.nn.Dense(5))  # the bottleneck
                self.decoder = gluon.nn.HybridSequential()
                with self.decoder.name_scope():
                    self.decoder.add(gluon.nn.Dense(64, activation="sigmoid"))

        def hybrid_forward(self, F, x, label):
            return self.decoder(self.encoder(x)).reshape((-1, 1, 8, 8)), label

    rng = np.random.default_rng(0)
    images = mx.nd.array(rng.random((20, 1, 8, 8)).astype("float32"))
    labels = mx.nd.array(rng.integers(0, 10, 20))
    model = ConvolutionalAutoencoder()
    model.collect_params().initialize(mx.init.Xavier("gaussian"), ctx=mx.cpu())
    loss_function = gluon.loss.L2Loss()
    optimizer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.001, "wd": 1e-5})
    hook = smd.Hook.create_from_json_file()
    hook.set_mode(smd.modes.TRAIN)
    for i in range(0, 20, 10):
        with autograd.record():
            output, _ = model(images[i:i + 10], labels[i:i + 10])
            loss = loss_function(output, images[i:i + 10])
        loss.backward()
        optimizer.step(10)
    hook.set_mode(smd.modes.EVAL)
    for i in range(0, 20, 10):
        output, _ = model(images[i:i + 10], labels[i:i + 10])
    hook.close()
    bottlenecks = [model.encoder(images[i:i + 10]).asnumpy() for i in (0, 10)]  # EVAL changed no weight
    trial = create_trial(run_dir)
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 1]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 1]
    bottleneck = trial.tensor(trial.tensor_names(collection="bottleneck")[0])
    for step, want in enumerate(bottlenecks):
        np.testing.assert_allclose(bottleneck.value(step, mode=smd.modes.EVAL), want, rtol=1e-5)

"""The Gluon hook's collections, checked value by value against the net's own tensors."""
import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import smdebug  # noqa: E402
import smdebug.mxnet as smd  # noqa: E402
from smdebug.mxnet.backend import MXNetBackend  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

PARAMS = ["dense0_weight", "dense0_bias", "dense1_weight", "dense1_bias"]


def snapshot(net, what):
    params = net.collect_params()
    if what == "data":
        return {name: p.data().asnumpy().copy() for name, p in params.items()}
    return {name: p.grad().asnumpy().copy() for name, p in params.items()}


def test_module_exports_the_core_objects():
    for name in ("SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionKeys", "ModeKeys"):
        assert getattr(smd, name) is getattr(smdebug, name)
    assert smd.modes is smdebug.modes
    assert issubclass(smd.Hook, smdebug.Hook) and smd.Hook.framework == "mxnet"


def test_weights_biases_gradients_equal_the_nets(run_dir, make_net, train):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    # After backward and before trainer.step: the values the step's forward pass used, and its gradients.
    def observe(stage, step):
        return (snapshot(net, "data"), snapshot(net, "grad")) if stage == "after" else None

    seen = train(net, loss_fn, trainer, 3, observe=observe)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    assert sorted(trial.tensor_names(collection="weights")) == ["dense0_weight", "dense1_weight"]
    assert sorted(trial.tensor_names(collection="biases")) == ["dense0_bias", "dense1_bias"]
    assert sorted(trial.tensor_names(collection="gradients")) == sorted("gradient/" + p for p in PARAMS)
    for step, entry in enumerate(seen):
        params, grads = entry["after"]
        for name in PARAMS:
            np.testing.assert_array_equal(trial.tensor(name).value(step), params[name])
            np.testing.assert_array_equal(trial.tensor("gradient/" + name).value(step), grads[name])
        assert np.array_equal(trial.tensor("softmaxcrossentropyloss0_output_0").value(step), entry["loss"])
    # The saved weights are those before the update: step 1's are step 0's minus one SGD step.
    w0, w1 = (trial.tensor("dense1_weight").value(s) for s in (0, 1))
    np.testing.assert_allclose(w1, w0 - 0.1 * seen[0]["after"][1]["dense1_weight"] / 16, rtol=1e-5, atol=1e-7)


def test_deferred_parameters_are_saved_after_the_first_forward(run_dir, make_net, data):
    net, loss_fn, _ = make_net()
    hook = smd.Hook(run_dir, include_collections=["weights"])
    hook.register_block(net)
    net(data[0])
    hook.close()
    trial = create_trial(run_dir)
    np.testing.assert_array_equal(trial.tensor("dense0_weight").value(0), net[0].weight.data().asnumpy())


def test_default_config_saves_only_the_loss(run_dir, make_net, train):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir)
    hook.register_block(net)
    hook.register_loss(loss_fn)
    seen = train(net, loss_fn, trainer, 3)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names() == ["softmaxcrossentropyloss0_output_0"]
    assert trial.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]
    assert trial.steps() == [0]  # the default interval is 500
    np.testing.assert_array_equal(trial.tensor("softmaxcrossentropyloss0_output_0").value(0), seen[0]["loss"])
    # Nothing wanted from the layers: no forward hook was attached to them.
    assert not net[0]._forward_hooks and not net[1]._forward_hooks


def test_block_tensors_inputs_outputs_and_call_index(run_dir, make_net, data):
    net, _, _ = make_net()
    x = data[0]
    hook = smd.Hook(run_dir, include_collections=["custom", "outputs"])
    hook.get_collection("custom").add_block_tensors(net[1], inputs=True, outputs=False)
    hook.register_block(net)
    out = net(x)
    hidden = net[0](x)  # a second call of dense0 in the same step: index 1
    hook.close()

    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="custom") == ["dense1_input_0"]
    np.testing.assert_allclose(trial.tensor("dense1_input_0").value(0), hidden.asnumpy(), rtol=1e-6)
    assert "dense1_output_0" not in trial.tensor_names(collection="custom")
    outputs = trial.tensor_names(collection="outputs")
    assert {"dense0_output_0", "dense0_output_1", "dense1_output_0", "hybridsequential0_output_0"} <= set(outputs)
    assert not any("_input_" in n for n in outputs)
    np.testing.assert_allclose(trial.tensor("hybridsequential0_output_0").value(0), out.asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(trial.tensor("dense0_output_1").value(0), hidden.asnumpy(), rtol=1e-6)


def test_inputs_collection_and_save_all(run_dir, make_net, data):
    net, loss_fn, _ = make_net()
    x, y = data
    hook = smd.Hook(run_dir, save_all=True)
    hook.register_block(net)
    hook.register_loss(loss_fn)
    loss_fn(net(x), y)
    hook.close()
    trial = create_trial(run_dir)
    names = set(trial.tensor_names())
    assert set(PARAMS) <= names
    assert {"hybridsequential0_input_0", "dense0_input_0", "softmaxcrossentropyloss0_input_0",
            "softmaxcrossentropyloss0_input_1", "softmaxcrossentropyloss0_output_0"} <= names
    np.testing.assert_array_equal(trial.tensor("hybridsequential0_input_0").value(0), x.asnumpy())
    np.testing.assert_array_equal(trial.tensor("softmaxcrossentropyloss0_input_1").value(0), y.asnumpy())
    # The loss regex keeps the loss's inputs out of `losses`.
    assert trial.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]


def test_modes_count_their_own_steps_and_eval_has_no_gradients(run_dir, make_net, train):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=2), include_collections=["weights", "gradients"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    train(net, loss_fn, trainer, 4)
    hook.set_mode(smd.modes.EVAL)
    train(net, loss_fn, trainer, 3, record=False)
    hook.set_mode(smd.modes.TRAIN)
    train(net, loss_fn, trainer, 2)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 2, 4, 6, 7]
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 2, 4]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 2]
    assert trial.mode_modestep(7) == (smd.modes.TRAIN, 4)
    grad = trial.tensor("gradient/dense1_weight")
    assert grad.steps() == [0, 2, 7]
    assert trial.tensor("dense1_weight").steps() == [0, 2, 4, 6, 7]


def test_save_scalar_and_save_tensor(run_dir, make_net, data):
    net, _, _ = make_net()
    hook = smd.Hook(run_dir)
    hook.register_block(net)
    net(data[0])
    hook.save_scalar("lr", 0.1)
    hook.save_tensor("my_activation", mx.nd.ones((2, 3)) * 7, "custom")
    hook.close()
    trial = create_trial(run_dir)
    assert float(trial.tensor("scalar/lr").value(0).reshape(-1)[0]) == pytest.approx(0.1)
    np.testing.assert_array_equal(trial.tensor("my_activation").value(0), np.full((2, 3), 7, np.float32))
    assert trial.tensor_names(collection="custom") == ["my_activation"]


def test_reductions_are_saved_for_weights(run_dir, make_net, train):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, include_collections=["weights"],
                    reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"],
                                                         abs_reductions=["min"]))
    hook.register_block(net)
    seen = train(net, loss_fn, trainer, 1,
                 observe=lambda stage, step: snapshot(net, "data") if stage == "after" else None)
    hook.close()
    trial = create_trial(run_dir)
    initial = seen[0]["after"]["dense1_weight"]
    saved = trial.tensor("dense1_weight").reduction_values(0)
    assert set(saved) == {("mean", False), ("max", False), ("l2", False), ("min", True)}
    np.testing.assert_allclose(saved[("mean", False)], initial.astype(np.float64).mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(saved[("max", False)], initial.max(), rtol=1e-6)
    np.testing.assert_allclose(saved[("l2", False)], np.linalg.norm(initial.ravel()), rtol=1e-5)
    np.testing.assert_allclose(saved[("min", True)], np.abs(initial).min(), rtol=1e-5)


def test_nothing_is_touched_on_steps_that_save_nothing(run_dir, make_net, train, monkeypatch):
    calls = {"snapshot": 0, "materialize": 0}
    for name in calls:
        original = getattr(MXNetBackend, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(MXNetBackend, name, counted)
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=100), save_all=True)
    hook.register_block(net)
    hook.register_loss(loss_fn)
    train(net, loss_fn, trainer, 1)
    after_step0 = dict(calls)
    assert after_step0["snapshot"] > 0
    train(net, loss_fn, trainer, 5)
    # Step 0 closes at step 1's forward (gradients, then materialize); nothing after that.
    assert calls["materialize"] == after_step0["materialize"] + 1
    snapshots_step1 = calls["snapshot"]
    train(net, loss_fn, trainer, 3)
    assert calls["snapshot"] == snapshots_step1
    hook.close()


def test_register_block_rejects_non_blocks(run_dir):
    hook = smd.Hook(run_dir)
    with pytest.raises(smdebug.exceptions.ConfigError, match="gluon.Block"):
        hook.register_block(object())
    with pytest.raises(smdebug.exceptions.ConfigError, match="gluon loss Block"):
        hook.register_loss(lambda a, b: a)
    hook.close()


def test_coll_add_with_a_block_saves_its_outputs_and_other_objects_raise(run_dir, make_net, train):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.register_block(net)
    hook.register_loss(loss_fn)
    hook.add_to_collection("second_layer", net[1])
    assert "second_layer" in hook.include_collections
    with pytest.raises(smdebug.exceptions.ConfigError, match=r"cannot add a NDArray of shape \(3,\) to collection 'x'.*"
                                                             r"hook.save_tensor\('<name>', value, 'x'\)"):
        hook.get_collection("x").add(mx.nd.ones(3))
    train(net, loss_fn, trainer, 2)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="second_layer") == ["dense1_output_0"]
    assert trial.tensor("dense1_output_0").value(1).shape == (16, 3)


def test_cli_default_rules_for_a_gluon_run(run_dir, make_net, train, capsys):
    from smdebug.analysis.rules.cli import main as cli_main

    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    train(net, loss_fn, trainer, 3)
    hook.close()
    assert cli_main([run_dir, "--no-progress"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("MXNet run, collections with saved tensors: gradients, losses, outputs; running 4 of the "
                          "default rules, skipping 9:")
    assert "  skipped WeightUpdateRatio: the 'weights' collection was not saved" in out
    ran = [line.split()[0] for line in out.splitlines() if not line.startswith(("  ", "MXNet"))]
    assert ran == ["VanishingGradient", "ExplodingTensor", "LossNotDecreasing", "LossSpike"]

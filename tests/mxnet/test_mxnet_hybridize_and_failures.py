"""Hybridized networks (one warning, the rest still saved) and failure safety."""
import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import smdebug.mxnet as smd  # noqa: E402
from smdebug.mxnet.backend import MXNetBackend  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

CHILD_OUTPUTS = {"dense0_output_0", "dense0_relu_output_0", "dense1_output_0"}


def hybrid_warnings(warnings_of):
    return [r for r in warnings_of() if "hybridized" in r.getMessage()]


@pytest.mark.parametrize("hybridize_before_register", [True, False])
def test_hybridized_net_warns_once_and_saves_the_rest(run_dir, make_net, train, warnings_of,
                                                      hybridize_before_register):
    net, loss_fn, trainer = make_net(hybridize=hybridize_before_register)
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "outputs", "losses"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    if not hybridize_before_register:
        with pytest.warns(UserWarning, match="hybridized while still having forward hook"):  # MXNet's own
            net.hybridize()
    seen = train(net, loss_fn, trainer, 3,
                 observe=lambda stage, step: net[1].weight.grad().asnumpy().copy() if stage == "after" else None)
    hook.close()

    assert len(hybrid_warnings(warnings_of)) == 1
    message = hybrid_warnings(warnings_of)[0].getMessage()
    assert "3 block(s)" in message and "dense0" in message
    trial = create_trial(run_dir)
    names = set(trial.tensor_names())
    assert not names & CHILD_OUTPUTS
    assert {"hybridsequential0_output_0", "softmaxcrossentropyloss0_output_0", "dense0_weight",
            "gradient/dense1_weight"} <= names
    for step in range(3):
        np.testing.assert_array_equal(trial.tensor("gradient/dense1_weight").value(step), seen[step]["after"])


def test_not_hybridized_captures_children_without_warning(run_dir, make_net, train, warnings_of):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, include_collections=["outputs"])
    hook.register_block(net)
    train(net, loss_fn, trainer, 2)
    hook.close()
    assert hybrid_warnings(warnings_of) == []
    assert CHILD_OUTPUTS <= set(create_trial(run_dir).tensor_names())


def test_hybridized_without_wanting_children_says_nothing(run_dir, make_net, train, warnings_of):
    net, loss_fn, trainer = make_net(hybridize=True)
    hook = smd.Hook(run_dir, include_collections=["weights"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    train(net, loss_fn, trainer, 2)
    hook.close()
    assert warnings_of() == []
    assert "dense1_weight" in create_trial(run_dir).tensor_names()


def test_failing_backend_disables_the_hook_with_one_warning(run_dir, make_net, train, warnings_of, monkeypatch):
    def broken(self, requests):
        raise RuntimeError("device on fire")

    monkeypatch.setattr(MXNetBackend, "materialize", broken)
    # Each make_net() seeds the RNG, and dense0 draws its weights at its first forward: train in turn.
    expected = train(*make_net(), 5)
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1), save_all=True)
    hook.register_block(net)
    hook.register_loss(loss_fn)
    seen = train(net, loss_fn, trainer, 5)
    hook.close()

    records = warnings_of()
    assert len(records) == 1 and "device on fire" in records[0].getMessage()
    assert not hook.enabled
    # Training went on exactly as without the hook.
    for got, want in zip(seen, expected):
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    # Detached: the disabled hook costs nothing from then on.
    assert not net._forward_pre_hooks and not net[0]._forward_hooks


def test_failure_inside_a_forward_hook_never_reaches_training(run_dir, make_net, train, warnings_of, monkeypatch):
    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.register_block(net)

    def broken():
        raise ValueError("cannot read parameters")

    monkeypatch.setattr(hook, "_record_parameters", broken)
    seen = train(net, loss_fn, trainer, 3)
    hook.close()
    assert len(seen) == 3
    records = warnings_of()
    assert len(records) == 1 and "cannot read parameters" in records[0].getMessage()


def test_request_stop_ends_training_at_the_next_forward(run_dir, make_net, data):
    from mxnet import autograd

    net, loss_fn, trainer = make_net()
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["gradients"])
    hook.register_block(net)
    x, y = data
    done = []
    with pytest.raises(smd.TrainingStopRequested, match="a rule fired"):
        for step in range(5):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
            done.append(step)
            if step == 1:
                hook.request_stop("a rule fired")
    assert done == [0, 1]
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1]
    assert trial.tensor("gradient/dense1_weight").steps() == [0, 1]  # the last step's gradients are kept

"""MXNet Gluon scripts written against smdebug 1.0.34 run unchanged (docs/migrating.md)."""
import pytest

mx = pytest.importorskip("mxnet")

import smdebug.mxnet as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def test_register_hook_is_register_block(run_dir, make_net, train):
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses"])
    net, loss_fn, trainer = make_net()
    hook.register_hook(net)  # 1.0.34's name
    hook.register_hook(loss_fn)
    train(net, loss_fn, trainer, 3)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    assert "dense1_weight" in trial.tensor_names(collection="weights")
    assert trial.tensor_names(collection="losses") == ["softmaxcrossentropyloss0_output_0"]


def test_del_hook(run_dir):
    hook = smd.Hook(out_dir=run_dir)
    assert smd.get_hook() is hook
    smd.del_hook()
    assert smd.get_hook() is None
    hook.close()


def test_a_custom_tensor_is_in_its_collection_for_a_trial_read_before_close(run_dir, make_net, train):
    # 1.0.34's test_custom_tensor reads the run before closing its hook: the tensor saved with
    # save_tensor is in the default collection, at the one step it was saved in.
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_steps=[0, 1, 2, 3]))
    net, loss_fn, trainer = make_net()
    hook.register_block(net)
    hook.register_loss(loss_fn)

    def observe(stage, step):
        if stage == "after" and step == 1:
            hook.save_tensor("custom_tensor_1", mx.nd.array([1.0, 2.0]))
    train(net, loss_fn, trainer, 6, observe=observe)
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="default") == ["custom_tensor_1"]
    assert trial.tensor("custom_tensor_1").steps() == [1]
    assert trial.steps() == [0, 1, 2, 3]
    hook.close()


def test_spot_training_resume_continues_the_step_numbers(tmp_path, monkeypatch, make_net, data):
    # 1.0.34's test_spot_hook: a second training with the same checkpoint directory numbers its
    # steps after the first one's; both runs are read before their hooks are closed.
    import json

    from mxnet import autograd

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(tmp_path / "ckpt")}))
    monkeypatch.setenv("CHECKPOINT_CONFIG_FILE_PATH", str(tmp_path / "checkpointconfig.json"))
    save_config = smd.SaveConfig(save_steps=[10, 11, 12, 13, 14, 40, 50, 60, 70, 80])
    x, y = data

    def run(out_dir, epochs):
        hook = smd.Hook(out_dir=str(out_dir), save_config=save_config, include_collections=["weights", "gradients"])
        net, loss_fn, trainer = make_net()
        hook.register_hook(net)
        hook.register_hook(loss_fn)
        for epoch in range(epochs):
            for _ in range(10):
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(x.shape[0])
            for _ in range(10):
                loss_fn(net(x), y)
            net.save_parameters(str(tmp_path / "ckpt" / f"params_{epoch}.params"))
        return hook

    first, second = run(tmp_path / "run1", 2), run(tmp_path / "run2", 4)
    steps_1, steps_2 = create_trial(str(tmp_path / "run1")).steps(), create_trial(str(tmp_path / "run2")).steps()
    assert 40 not in steps_1 and 80 not in steps_1 and {10, 11, 12, 13, 14} <= set(steps_1)
    assert {40, 50, 60, 70, 80} <= set(steps_2) and not {0, 10, 11, 12} & set(steps_2)
    first.close()
    second.close()

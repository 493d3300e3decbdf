"""The Gluon hook writing to an fsspec URL (``memory://``, fsspec's in-process store): the
run reads back equal, tensor for tensor, to the same training written to a local directory."""
import numpy as np
import pytest

pytest.importorskip("mxnet")
pytest.importorskip("fsspec")

import smdebug.mxnet as smd
from smdebug.trials import create_trial


def _train(out_dir, make_net, train):
    import mxnet as mx

    with mx.name.NameManager():  # both runs name their blocks dense0, dense1
        net, loss_fn, trainer = make_net()
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.register_block(net)
    hook.register_loss(loss_fn)
    train(net, loss_fn, trainer, 3)
    hook.close()


def test_mxnet_run_at_a_memory_url_equals_the_local_run(tmp_path, make_net, train, monkeypatch):
    monkeypatch.setenv("SMDEBUG_SPOOL_DIR", str(tmp_path / "spools"))
    _train(str(tmp_path / "local"), make_net, train)
    _train("memory://mxnet-run", make_net, train)
    local, remote = create_trial(str(tmp_path / "local")), create_trial("memory://mxnet-run")
    assert remote.training_ended()
    assert remote.steps() == local.steps() == [0, 1, 2]
    assert remote.tensor_names() == local.tensor_names()
    assert "gradient/dense0_weight" in remote.tensor_names()
    for name in local.tensor_names():
        for step in local.tensor(name).steps():
            np.testing.assert_array_equal(remote.tensor(name).value(step), local.tensor(name).value(step))

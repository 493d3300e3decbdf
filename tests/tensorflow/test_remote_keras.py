"""KerasHook writing to s3:// (moto's S3 server on loopback): the run on S3 reads back equal,
tensor for tensor, to the same training written to a local directory."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("moto.server", reason="needs moto[server]")
pytest.importorskip("s3fs")

import smdebug.tensorflow as smd
from smdebug.trials import create_trial

from conftest import make_model


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from s3_endpoint import serve


@pytest.fixture
def s3(tmp_path, monkeypatch):
    endpoint = serve(monkeypatch, tmp_path, "keras")
    yield endpoint.client()
    endpoint.stop()


def _fit(out_dir, data, **hook_args):
    x, y = data
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses", "metrics"], **hook_args)
    make_model(seed=3).fit(x, y, batch_size=4, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()


def test_keras_run_on_s3_equals_the_local_run(s3, tmp_path, data):
    _fit(str(tmp_path / "local"), data)
    _fit("s3://keras/runs/a", data, export_tensorboard=True)
    local, remote = create_trial(str(tmp_path / "local")), create_trial("s3://keras/runs/a")
    assert remote.training_ended()
    assert remote.steps() == local.steps() == [0, 1, 2]
    assert remote.tensor_names() == local.tensor_names()
    assert any(n.startswith("gradients/") for n in remote.tensor_names())
    for name in local.tensor_names():
        for step in local.tensor(name).steps():
            np.testing.assert_allclose(remote.tensor(name).value(step), local.tensor(name).value(step), rtol=1e-6)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="keras", Prefix="runs/a/")["Contents"]]
    assert any(k.startswith("runs/a/tensorboard/") for k in keys)  # uploaded once, at close
    leftover = [f for _, _, fs in os.walk(tmp_path / "spools") for f in fs if not f.startswith(".smdebug")]
    assert leftover == []

"""Shared nets and a training loop for the MXNet adapter tests (tiny, CPU, seconds).

mxnet is imported inside the fixtures: each test module skips itself with
``pytest.importorskip("mxnet")`` when it is missing.
"""

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def fresh_block_names():
    """Gluon numbers unnamed blocks process-wide (dense0, dense1, ...): start each test at 0."""
    import mxnet as mx

    with mx.name.NameManager():
        yield


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")


@pytest.fixture
def data():
    """(x, y): 16 samples, 5 features, 3 classes, as mx.nd arrays."""
    import mxnet as mx

    rng = np.random.default_rng(0)
    return mx.nd.array(rng.standard_normal((16, 5))), mx.nd.array(rng.integers(0, 3, 16))


@pytest.fixture
def make_net():
    """``make_net(hybridize=False) -> (net, loss_fn, trainer)``: Dense(8, relu) -> Dense(3), SGD.

    The first layer infers its input size at the first forward pass (deferred initialization).
    """
    import mxnet as mx
    from mxnet import gluon

    def make(hybridize=False):
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3, in_units=8))
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize()
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        return net, loss_fn, trainer

    return make


@pytest.fixture
def train(data):
    """``train(net, loss_fn, trainer, steps, observe=None) -> [observed per step]``.

    ``observe(stage, step)`` is called with stage ``"before"`` (before the forward pass)
    and ``"after"`` (after backward, before the update); its results are returned as
    ``[{"before": ..., "after": ..., "loss": ...}]``.
    """
    from mxnet import autograd

    x, y = data

    def run(net, loss_fn, trainer, steps, observe=None, record=True):
        seen = []
        for step in range(steps):
            entry = {}
            if observe:
                entry["before"] = observe("before", step)
            if record:
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                if observe:
                    entry["after"] = observe("after", step)
                trainer.step(x.shape[0])
            else:
                loss = loss_fn(net(x), y)
            entry["loss"] = loss.asnumpy()
            seen.append(entry)
        return seen

    return run


@pytest.fixture
def warnings_of(smdebug_warnings):
    return smdebug_warnings

"""MoE routing statistics (hook.register_router and routers a model declares) on a tiny
top-k mixture of experts, against numpy computations from the router logits of each call."""
import logging
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

EXPERTS, TOP_K, DIM = 4, 2, 6


class TopKMoE(torch.nn.Module):
    """A sparse MoE block declaring its router as Hugging Face's Mixtral does: ``gate``,
    ``num_experts``, ``top_k``; with ``capacity_factor``, an expert takes at most
    ceil(factor * assignments / experts) assignments per call, the rest are dropped."""

    def __init__(self, capacity_factor=None):
        super().__init__()
        self.num_experts, self.top_k = EXPERTS, TOP_K
        self.gate = torch.nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(DIM, DIM) for _ in range(EXPERTS))
        if capacity_factor is not None:
            self.capacity_factor = capacity_factor

    def forward(self, x):
        tokens = x.reshape(-1, DIM)
        weights, chosen = torch.softmax(self.gate(tokens), dim=-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if hasattr(self, "capacity_factor"):
                rows, slot = rows[:math.ceil(self.capacity_factor * chosen.numel() / EXPERTS)], \
                    slot[:math.ceil(self.capacity_factor * chosen.numel() / EXPERTS)]
            out[rows] += weights[rows, slot, None] * expert(tokens[rows])
        return out.reshape(x.shape)


class Net(torch.nn.Module):
    def __init__(self, capacity_factor=None):
        super().__init__()
        torch.manual_seed(0)
        self.moe = TopKMoE(capacity_factor)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, x):
        return self.head(self.moe(x)).mean()


def expected(logits_of_calls, capacity_factor=None):
    counts, entropy, tokens, dropped = np.zeros(EXPERTS), 0.0, 0, 0.0
    for logits in logits_of_calls:
        z = logits.reshape(-1, EXPERTS).astype(np.float64)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        entropy += float(-(p * np.log(p)).sum())
        call = np.zeros(EXPERTS)
        for row in p:
            for e in np.argsort(-row)[:TOP_K]:
                call[e] += 1
        if capacity_factor is not None:
            dropped += np.maximum(call - math.ceil(capacity_factor * z.shape[0] * TOP_K / EXPERTS), 0).sum()
        counts += call
        tokens += z.shape[0]
    out = {"expert_fraction": counts / counts.sum(), "load_cv": counts.std() / counts.mean(),
           "entropy": entropy / tokens}
    if capacity_factor is not None:
        out["dropped_fraction"] = dropped / counts.sum()
    return out


def train(model, steps, calls_per_step=1, hook=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1)
    logits = []
    model.moe.gate.register_forward_hook(lambda m, a, out: logits.append(out.detach().numpy().copy()))
    if hook is not None:
        hook.register_optimizer(optimizer)
    per_step = []
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(calls_per_step):  # gradient accumulation: one step, several forwards
            model(torch.randn(3, 5, DIM, generator=gen)).backward()
        optimizer.step()
        per_step.append(logits[-calls_per_step:])
    return per_step


@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_register_router_saves_the_step_routing_statistics(tmp_path, capacity_factor):
    model = Net(capacity_factor)
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2))
    hook.register_module(model)
    hook.register_router(model.moe.gate, num_experts=EXPERTS, top_k=TOP_K)
    per_step = train(model, 5, calls_per_step=2, hook=hook)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    names = {f"router/moe.gate/{s}" for s in ("expert_fraction", "load_cv", "entropy")}
    if capacity_factor is not None:
        names.add("router/moe.gate/dropped_fraction")
    assert set(trial.tensor_names(collection="router")) == names
    for step in (0, 2, 4):
        want = expected(per_step[step], capacity_factor)
        for stat, value in want.items():
            np.testing.assert_allclose(trial.tensor(f"router/moe.gate/{stat}").value(step), value, rtol=1e-6,
                                       err_msg=f"{stat} at {step}")
    assert trial.tensor("router/moe.gate/entropy").steps() == [0, 2, 4]
    if capacity_factor is not None:
        assert trial.tensor("router/moe.gate/dropped_fraction").value(0) > 0


def test_a_router_the_model_declares_is_found_and_saved_when_the_collection_is_included(tmp_path):
    model = Net()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["router"])
    hook.register_module(model)
    per_step = train(model, 2, hook=hook)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    np.testing.assert_allclose(trial.tensor("router/moe.gate/load_cv").value(1), expected(per_step[1])["load_cv"],
                               rtol=1e-6)
    # without the collection: nothing of the router
    model = Net()
    hook = smd.Hook(out_dir=str(tmp_path / "plain"), save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    train(model, 2, hook=hook)
    hook.close()
    assert not any(n.startswith("router/") for n in create_trial(str(tmp_path / "plain")).tensor_names())


def test_wrong_arguments_fail_at_registration_and_wrong_logits_warn_once(tmp_path, caplog):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    model = Net()
    with pytest.raises(ConfigError, match="top_k"):
        hook.register_router(model.moe.gate, num_experts=EXPERTS, top_k=5)
    with pytest.raises(ConfigError, match="num_experts"):
        hook.register_router(model.moe.gate, num_experts="4", top_k=1)
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        hook.register_router(lambda x: x, num_experts=4, top_k=1)
    hook.register_router(model.head, num_experts=3, top_k=1)  # its output has no last dimension of 3
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(model, 3, hook=hook)
        hook.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "router" in warnings[0] and "num_experts=3" in warnings[0], warnings
    trial = create_trial(str(tmp_path / "run"))  # the rest of the capture went on
    assert trial.steps() == [0, 1, 2] and trial.tensor("Net_head.weight").steps() == [0, 1, 2]

"""VanishingGradient on runs that saved only the L2 norm (and shape) of each gradient: it
converts to the RMS L2/sqrt(n), says so, fires on a deep tanh MLP whose gradients vanish
and stays silent on a healthy one."""
import numpy as np
import pytest

import smdebug as smd
from smdebug.rules import VanishingGradient, invoke_rule
from smdebug.trials import create_trial


def train_tanh_mlp(out_dir, depth, init_std, steps=6, width=16, seed=0, save_shape=True):
    """SGD on a tanh MLP regression (numpy backprop), the hook saving only each weight
    gradient's L2 norm (and its shape) at every step."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((width, width)) * init_std for _ in range(depth)]
    x = rng.standard_normal((32, width))
    y = np.sin(x[:, :1])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "losses"],
                    reduction_config=smd.ReductionConfig(norms=["l2"], save_shape=save_shape))
    for _ in range(steps):
        hook.begin_step()
        acts = [x]
        for w in weights:
            acts.append(np.tanh(acts[-1] @ w))
        err = acts[-1][:, :1] - y
        hook.save_scalar("loss", float(np.mean(err ** 2)))
        delta = np.zeros_like(acts[-1])
        delta[:, :1] = 2 * err / len(x)
        grads = []
        for i in reversed(range(depth)):
            delta = delta * (1 - acts[i + 1] ** 2)
            grads.append((i, acts[i].T @ delta))
            delta = delta @ weights[i].T
        for i, g in grads:
            hook.record(f"gradient/layers.{i}.weight", g.astype(np.float32))
            weights[i] -= 0.1 * g
    hook.close()
    return out_dir


def test_vanishing_gradient_fires_from_l2_norms_of_a_deep_tanh_mlp(tmp_path):
    run = train_tanh_mlp(str(tmp_path / "deep"), depth=24, init_std=0.05)
    trial = create_trial(run)
    step0 = trial.tensor("gradient/layers.0.weight")
    assert step0.reduction_values(0).keys() == {("l2", False)}  # only the L2 norm was saved
    doc = invoke_rule(VanishingGradient(trial)).to_dict()
    assert doc["datapoints"] == 6 and doc["tensors_unavailable"] == 0  # every step evaluated
    assert doc["triggered"] == 6, doc
    first = doc["violations"][0]
    assert "converted" in first["message"] and "L2/sqrt(n)" in first["message"]
    assert "gradient/layers.0.weight" in first["details"]["converted_from_l2"]
    # the RMS it judged by is the saved L2 over sqrt(16 * 16)
    l2 = step0.reduction_value(0, "l2")
    assert first["details"]["tensors"]["gradient/layers.0.weight"] == pytest.approx(l2 / 16, rel=1e-5)


def test_vanishing_gradient_silent_on_a_healthy_mlp_from_l2_norms(tmp_path):
    run = train_tanh_mlp(str(tmp_path / "healthy"), depth=3, init_std=1 / np.sqrt(16))
    doc = invoke_rule(VanishingGradient(create_trial(run))).to_dict()
    assert not doc["violations"], doc
    assert doc["datapoints"] == 6 and doc["tensors_unavailable"] == 0  # judged (from L2), not skipped


def test_vanishing_gradient_without_a_shape_cannot_convert_and_says_what_it_reads(tmp_path):
    run = train_tanh_mlp(str(tmp_path / "noshape"), depth=24, init_std=0.05, save_shape=False)
    doc = invoke_rule(VanishingGradient(create_trial(run))).to_dict()
    assert not doc["violations"] and doc["tensors_unavailable"] == 6 * 24  # counted, not guessed
    assert "L2/sqrt(n)" in VanishingGradient.reads_what

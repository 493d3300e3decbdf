"""VanishingGradient on runs that saved only the L2 norm (and shape) of each gradient: it
converts to the RMS L2/sqrt(n), says so, fires on a deep tanh MLP whose gradients vanish
and stays silent on a healthy one."""
import numpy as np
import pytest

import smdebug as smd
from smdebug.rules import VanishingGradient, invoke_rule
from smdebug.trials import create_trial


def train_tanh_mlp(out_dir, depth, init_std, steps=6, width=16, seed=0, save_shape=True, weights_every=0):
    """SGD on a tanh MLP regression (numpy backprop), the hook saving only each weight
    gradient's L2 norm (and its shape) at every step; with ``weights_every``, the weights
    whole every that many steps (as docs/report_48_layers.png's run does)."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((width, width)) * init_std for _ in range(depth)]
    x = rng.standard_normal((32, width))
    y = np.sin(x[:, :1])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "losses"] + (["whole_weights"] if weights_every else []),
                    reduction_config=smd.ReductionConfig(norms=["l2"], save_shape=save_shape))
    if weights_every:  # whole values: no reductions for this collection
        hook.get_collection("whole_weights").reduction_config = smd.ReductionConfig(save_raw_tensor=True)
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
            if weights_every and hook.global_step % weights_every == 0:
                hook.save_tensor(f"layers.{i}.weight", weights[i].astype(np.float32), "whole_weights")
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


def test_vanishing_gradient_takes_the_element_count_from_the_parameter_saved_whole(tmp_path):
    """docs/report_48_layers.png's construction: each gradient's L2 norm at every step, no
    gradient shape, the weights whole every 3rd step. A gradient has its parameter's shape,
    so every step is judged, and the vanishing gradients of the deep MLP fire."""
    run = train_tanh_mlp(str(tmp_path / "deep"), depth=24, init_std=0.05, save_shape=False, weights_every=3)
    trial = create_trial(run)
    assert trial.tensor("gradient/layers.0.weight").reduction_values(1).keys() == {("l2", False)}
    doc = invoke_rule(VanishingGradient(trial)).to_dict()
    assert doc["datapoints"] == 6 and doc["tensors_unavailable"] == 0, doc
    assert doc["triggered"] == 6 and "its parameter" in doc["violations"][0]["message"]


def test_a_collection_whose_reduction_config_saves_nothing_is_named_in_a_warning(tmp_path, caplog):
    """An empty ReductionConfig on a collection saves nothing, as in smdebug 1.0.34 (which the
    run above first did by mistake): the hook says so instead of saving nothing silently."""
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["mine"], reduction_config=smd.ReductionConfig(norms=["l2"]))
    hook.get_collection("mine").reduction_config = smd.ReductionConfig()
    with caplog.at_level("WARNING", logger="smdebug"):
        hook.begin_step()
        hook.save_tensor("w", np.ones(3), "mine")
        hook.close()
    assert any("'mine' saves nothing" in r.getMessage() and "save_raw_tensor=True" in r.getMessage()
               for r in caplog.records), caplog.text

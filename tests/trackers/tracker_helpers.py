"""What the tracker tests train: a numpy loop saving per-layer reductions and a loss."""
import numpy as np

import smdebug as smd

LAYERS = 5


def train(hook, steps=6, layers=LAYERS, eval_every=3):
    """A numpy 'training': per-layer weights (reduced) and a loss per step; an EVAL step now and then."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((4, 3)) for _ in range(layers)]
    losses = {}
    for step in range(steps):
        hook.set_mode(smd.modes.TRAIN)
        hook.begin_step()
        for i, w in enumerate(weights):
            w *= 0.9
            hook.record(f"layer{i}.weight", w)
        loss = 1.0 / (step + 1)
        losses[hook.global_step] = loss
        hook.save_scalar("loss", loss)
        hook.end_step()
        if eval_every and step % eval_every == eval_every - 1:
            hook.set_mode(smd.modes.EVAL)
            hook.begin_step()
            hook.save_scalar("loss", 2.0)
            hook.end_step()
    return losses, weights


def make_hook(tmp_path, name="run"):
    return smd.Hook(out_dir=str(tmp_path / name), include_collections=["weights"],
                    reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]),
                    save_config=smd.SaveConfig(save_interval=1))

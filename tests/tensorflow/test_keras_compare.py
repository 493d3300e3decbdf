"""smdebug compare on two real Keras runs made to differ at a known step and layer."""
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("pandas")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug.analysis import compare  # noqa: E402
from smdebug.analysis.cli import main  # noqa: E402

from conftest import make_model  # noqa: E402

NUDGED_STEP = 4


class Nudge(keras.callbacks.Callback):
    """Adds 0.05 to one weight of layer d2 before global training batch ``at``."""

    def __init__(self, at):
        super().__init__()
        self.at, self.batches = at, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.batches == self.at:
            kernel = self.model.get_layer("d2").kernel
            kernel.assign(kernel.numpy() + np.eye(*kernel.shape, dtype="float32") * 0.05)
        self.batches += 1


def fit(out_dir, x, y, nudge_at=None):
    model = make_model()
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "biases", "gradients", "losses"])
    callbacks = [hook] + ([Nudge(nudge_at)] if nudge_at is not None else [])
    model.fit(x, y, batch_size=2, epochs=2, shuffle=False, callbacks=callbacks, verbose=0)
    hook.close()
    return out_dir


def test_keras_runs_diverge_at_the_nudged_step_and_layer(tmp_path, data, capsys):
    x, y = data
    ref = fit(str(tmp_path / "ref"), x, y)
    same = fit(str(tmp_path / "same"), x, y)
    nudged = fit(str(tmp_path / "nudged"), x, y, nudge_at=NUDGED_STEP)
    assert main(["compare", ref, same, "--diverge"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("no divergence: ")
    result = compare([ref, nudged])
    div = result.divergence
    # Keras writes a step's loss and gradients before its weights, but the weights it saves
    # are those the step started from (the nudge shows whole in them): they come first.
    assert (div.step, div.mode, div.tensor, div.reduction) == (NUDGED_STEP, "TRAIN", "d2/weights/d2/kernel", "")
    assert div.element == (0, 0)
    assert div.values["nudged"] - div.values["ref"] == pytest.approx(0.05, rel=1e-5)
    assert not result.frame[result.frame.step < NUDGED_STEP]["differs"].any()
    loss = result.frame[(result.frame.tensor == "loss") & (result.frame.step == NUDGED_STEP)]
    assert loss["differs"].tolist() == [True]
    assert main(["compare", ref, nudged, "--diverge"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith(f"first divergence: step {NUDGED_STEP}, tensor d2/weights/d2/kernel (element [0, 0])")

"""Zero code change: an unmodified Lightning script, configured only by SMDEBUG_CONFIG_FILE_PATH."""
import numpy as np
import pytest

from trainer_helpers import run_unmodified, write_config
from smdebug.trials import create_trial

# The user's script: no smdebug in it. 8 batches, 2 per optimizer step, then validation.
SCRIPT = """
import json, sys
import torch
import pytorch_lightning as pl

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.losses = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
        self.losses.append(loss.item())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(4 * n, 4, generator=g), torch.randint(0, 3, (4 * n,), generator=g)), batch_size=4)

torch.manual_seed(0)
model = Model()
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, accumulate_grad_batches=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, log_every_n_steps=1)
trainer.fit(model, data(8, 0), data(2, 1))
print(json.dumps({"losses": model.losses, "global_step": trainer.global_step,
                  "callbacks": [type(c).__name__ for c in trainer.callbacks],
                  "torch_instrumentor_hooks": len(torch.nn.modules.module._global_forward_pre_hooks)}))
"""


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_unmodified_lightning_script_is_captured_by_one_callback(tmp_path, package):
    """With either Lightning package: ``pytorch_lightning`` or the unified ``lightning``,
    whose Trainer is a class of its own (it accepts only its own Callback subclasses)."""
    pytest.importorskip(package)
    out = tmp_path / "run"
    config = write_config(tmp_path / "hook.json", out, {"save_interval": "1"}, ["weights", "gradients", "losses"])
    script = SCRIPT.replace("import pytorch_lightning as pl", f"import {package} as pl")
    result, _ = run_unmodified(tmp_path, script, {"SMDEBUG_CONFIG_FILE_PATH": config})
    assert result["global_step"] == 4
    assert result["callbacks"].count("DebuggerCallback") == 1
    assert result["torch_instrumentor_hooks"] == 0  # the PyTorch instrumentor stood down: the callback owns the hook
    trial = create_trial(str(out))
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("TRAIN", 1), ("TRAIN", 2), ("TRAIN", 3), ("EVAL", 0), ("EVAL", 1)]
    assert trial.tensor("gradient/Model_net.0.weight").steps() == [0, 1, 2, 3]
    # one step per optimizer step: the mean of its two micro-batches' losses
    losses = result["losses"]
    np.testing.assert_allclose([trial.tensor("loss").value(s) for s in range(4)],
                               [np.mean(losses[2 * i:2 * i + 2]) for i in range(4)], rtol=1e-5)
    assert trial.tensor("scalar/val_loss").steps() == [5]


def test_a_bad_config_warns_once_and_training_runs(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text('{"LocalPath": 42}')
    result, stderr = run_unmodified(tmp_path, SCRIPT, {"SMDEBUG_CONFIG_FILE_PATH": str(config)})
    assert result["global_step"] == 4
    assert stderr.count("zero code change: the config is not usable") == 1

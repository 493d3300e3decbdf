"""Train a small LightningModule with smdebug's DebuggerCallback, then read the run back.

The data are synthetic (no download): 3 classes of points around 3 centres in 8
dimensions. The callback saves, with one smdebug step per optimizer step (2 batches each,
``accumulate_grad_batches=2``):

* weights, biases and the accumulated gradients every ``--interval`` steps, with their L2
  norms,
* the step's loss (``losses``), and what ``self.log`` logged as scalars every 5 steps,
* one EVAL step per validation batch.

A few seconds on two CPU cores:

    python examples/lightning/train_lightning.py --out-dir /tmp/lightning_run
"""
import argparse
import tempfile

import pytorch_lightning as pl
import torch

from smdebug.lightning import DebuggerCallback, ReductionConfig, SaveConfig, create_trial, modes


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def points(n, seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=gen)
    centres = torch.randn(3, 8, generator=torch.Generator().manual_seed(42)) * 2
    x = centres[labels] + torch.randn(n, 8, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, labels), batch_size=16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--interval", type=int, default=10, help="save whole tensors every N steps")
    args = parser.parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="smdebug_lightning_")

    callback = DebuggerCallback(out_dir=out_dir, save_config=SaveConfig(save_interval=args.interval),
                                include_collections=["weights", "biases", "gradients", "losses"],
                                reduction_config=ReductionConfig(norms=["l2"], save_raw_tensor=True),
                                overwrite=True)
    torch.manual_seed(0)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=args.epochs, accumulate_grad_batches=2,
                         callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, log_every_n_steps=5)
    trainer.fit(Classifier(), points(512, 0), points(128, 1))
    callback.close()

    trial = create_trial(out_dir)
    train_steps = trial.steps(mode=modes.TRAIN)
    print(f"{out_dir}: {len(train_steps)} TRAIN steps written (trainer.global_step={trainer.global_step}), "
          f"{len(trial.steps(mode=modes.EVAL))} EVAL steps")
    loss = trial.tensor("loss")
    saved = loss.steps(mode=modes.TRAIN)
    print("loss:", " ".join(f"{loss.value(s, mode=modes.TRAIN):.3f}" for s in saved))
    norm = trial.tensor("gradient/Classifier_net.0.weight")
    print("|grad net.0.weight|:", " ".join(f"{norm.reduction_value(s, 'l2', mode=modes.TRAIN):.3f}"
                                           for s in saved))
    val_acc = trial.tensor("scalar/val_acc")
    print("val_acc after each epoch:", [round(val_acc.value(s).item(), 3) for s in val_acc.steps()])
    assert saved == list(range(0, trainer.global_step, args.interval))  # TRAIN steps = optimizer steps


if __name__ == "__main__":
    main()

"""A tiny LightningModule and synthetic data shared by the Lightning tests."""
import torch
import pytorch_lightning as pl


class TinyModule(pl.LightningModule):
    """Linear(4, 8) -> ReLU -> Linear(8, 3), SGD; keeps copies of what each optimizer step used.

    ``seen[n]``: parameter name -> (weight, accumulated .grad) just before optimizer step ``n``
    (LightningModule.on_before_optimizer_step runs after the callbacks' hook).
    """

    def __init__(self, lr=0.1):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.lr = lr
        self.seen = {}
        self.losses = []  # training_step losses, in order

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.losses.append(float(loss))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("val_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def on_before_optimizer_step(self, optimizer):
        self.seen[self.trainer.global_step] = {
            name: (p.detach().clone(), p.grad.detach().clone()) for name, p in self.named_parameters()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(n_batches, batch_size=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * batch_size, 4, generator=gen)
    y = torch.randint(0, 3, (n_batches * batch_size,), generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def trainer(callbacks, **kwargs):
    """A quiet CPU Trainer: no checkpoints, no logger, no progress bar, no sanity check."""
    options = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   log_every_n_steps=1)
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **options)

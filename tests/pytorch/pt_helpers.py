"""Small models and a training loop shared by the PyTorch adapter tests.

Test modules call ``pytest.importorskip("torch")`` before importing this, so the core
environment (without torch) skips the folder.
"""
import json

import torch


class Net(torch.nn.Module):
    """conv -> relu -> pool -> fc1 -> relu -> fc2 on 1x6x6 inputs; 3 classes."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.relu = torch.nn.ReLU()
        self.fc1 = torch.nn.Linear(8, 6)
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(self.relu(self.conv(x)), 2).flatten(1)
        return self.fc2(self.relu(self.fc1(x)))


def batches(n, batch_size=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, 1, 6, 6, generator=gen), torch.randint(0, 3, (batch_size,), generator=gen))
            for _ in range(n)]


def make_model(seed=0, cls=Net):
    torch.manual_seed(seed)
    return cls()


def train(model, loss_fn, data, optimizer=None, accumulate=1, after_step=None):
    """A plain loop: zero_grad, forward, loss, backward, step every ``accumulate`` batches."""
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    optimizer.zero_grad()
    for i, (x, y) in enumerate(data):
        loss = loss_fn(model(x), y) / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            optimizer.step()
            if after_step is not None:
                after_step(i)
            optimizer.zero_grad()
    return optimizer


def evaluate(model, loss_fn, data):
    model.eval()
    with torch.no_grad():
        for x, y in data:
            loss_fn(model(x), y)


def write_config(path, out_dir, hook_parameters=None, collections=()):
    """Write a JSON hook config; ``collections`` are names or (name, parameters) pairs."""
    entries = []
    for item in collections:
        name, params = (item, None) if isinstance(item, str) else item
        entries.append({"CollectionName": name, "CollectionParameters": params})
    path.write_text(json.dumps({"LocalPath": str(out_dir), "HookParameters": hook_parameters or {},
                                "CollectionConfigurations": entries}))
    return str(path)

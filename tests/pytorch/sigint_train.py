"""A training loop stopped by Ctrl-C at a random moment, run by test_pytorch_interrupt.py.

``python sigint_train.py <out_dir> <ready_file> <done_file>``: trains a small CNN step after step with a
PyTorch hook saving weights, gradients, losses and every module's outputs at every step,
creates ``ready_file`` once two steps have run, and trains on until a SIGINT ends it (the
default handler: a ``KeyboardInterrupt`` wherever the main thread is, inside the hook's own
callbacks too). The hook is closed at interpreter exit (atexit), as in a script that never
calls ``hook.close()`` itself. On the way out it writes into ``done_file`` how many optimizer
steps had returned (one more may have returned before the count was raised).

``SIGINT_TRAIN_OPTIMIZER=register`` registers the optimizer (otherwise it is recognised at its
first step); ``SIGINT_TRAIN_ACCUMULATE=<n>`` steps the optimizer every ``n`` micro-batches.
"""
import os
import sys

import torch

import smdebug.pytorch as smd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.relu = torch.nn.ReLU()
        self.fc1 = torch.nn.Linear(64, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(self.relu(self.conv(x)), 2).flatten(1)
        return self.fc2(self.relu(self.fc1(x)))


def main(out_dir, ready_file, done_file):
    torch.manual_seed(0)
    model, loss_fn = Net(), torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses", "outputs"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if os.environ.get("SIGINT_TRAIN_OPTIMIZER") == "register":
        hook.register_optimizer(optimizer)
    accumulate = int(os.environ.get("SIGINT_TRAIN_ACCUMULATE", "1"))
    x, y = torch.randn(8, 1, 10, 10), torch.randint(0, 3, (8,))
    i = done = 0
    try:
        while True:
            loss = loss_fn(model(x), y) / accumulate
            loss.backward()
            i += 1
            if i % accumulate == 0:
                optimizer.step()
                done += 1
                optimizer.zero_grad()
            if i == 2 * accumulate:
                open(ready_file, "w").close()
    except KeyboardInterrupt:
        with open(done_file, "w") as f:
            f.write(str(done))
        raise  # the process ends by the interrupt; the hook closes at exit


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Run by the ORIGINAL smdebug 1.0.34's interpreter (with torch): write a run, then dump it.

    $SMDEBUG_ORIGINAL_PYTHON tests/compat/original_torch_run.py RUN_DIR OUT_JSON

Trains a tiny torch model with the original ``smdebug.pytorch.Hook`` (TRAIN, then EVAL,
then TRAIN again, save_interval 2) so that the run has raw tensors, reductions of every
kind, shape-only entries, a shape next to a raw value (the original's own reader then
loses that value: docs/format.md 3.2), scalars, and tensors of several dtypes saved with
``save_tensor``. Then writes what the original's own reader sees (original_dump_trial).
"""
import sys

import torch
import torch.nn as nn

import smdebug.pytorch as smd
from smdebug import modes

from compat_json import dumps
from original_dump_trial import dump_trial


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=3)  # a 4-D weight
        self.fc1 = nn.Linear(16, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def main(argv):
    if len(argv) != 3:
        sys.exit(f"usage: {argv[0]} RUN_DIR OUT_JSON")
    run_dir, out_json = argv[1], argv[2]
    torch.manual_seed(0)
    net = Net()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    hook = smd.Hook(
        out_dir=run_dir,
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=["weights", "gradients", "losses", "biases", "activations", "extras"],
    )
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std", "variance", "sum", "prod"],
        abs_reductions=["min", "max", "mean"],
        norms=["l1", "l2"],
        abs_norms=["l1", "l2"],
        save_raw_tensor=True,
    )
    # Shape and a reduction only, no raw value.
    hook.get_collection("biases").reduction_config = smd.ReductionConfig(reductions=["mean"], save_shape=True)
    # Raw value *and* shape: the original's reader keeps only the shape (docs/format.md 3.2).
    hook.get_collection("activations").include("fc1_output")
    hook.get_collection("activations").reduction_config = smd.ReductionConfig(save_raw_tensor=True, save_shape=True)
    # save_tensor's collection needs its config set up front, or the original's hook
    # fails on a None reduction config when it writes the tensor.
    hook.get_collection("extras").include("^extras/")
    hook.get_collection("extras").reduction_config = smd.ReductionConfig(save_raw_tensor=True)
    hook.register_module(net)
    hook.register_loss(loss_fn)

    def phase(mode, n, train):
        hook.set_mode(mode)
        for i in range(n):
            x = torch.randn(4, 1, 4, 6)
            y = torch.randint(0, 3, (4,))
            if train:
                opt.zero_grad()
            with torch.set_grad_enabled(train):
                loss = loss_fn(net(x), y)
            if train:
                loss.backward()
                opt.step()
            hook.save_tensor("extras/labels", y, "extras")  # int64
            hook.save_tensor("extras/correct", y == 1, "extras")  # bool
            hook.save_tensor("extras/pixels", (x[0, 0] * 40 + 128).clamp(0, 255).to(torch.uint8), "extras")
            hook.save_tensor("extras/x64", x[0, 0].double(), "extras")
            hook.save_scalar("lr" if train else "val_metric", 0.1 / (i + 1))

    phase(modes.TRAIN, 5, True)
    phase(modes.EVAL, 3, False)
    phase(modes.TRAIN, 3, True)
    hook.close()

    with open(out_json, "w") as fh:
        fh.write(dumps(dump_trial(run_dir)))


if __name__ == "__main__":
    main(sys.argv)

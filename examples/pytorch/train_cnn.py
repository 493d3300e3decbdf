"""Train a small conv net with the smdebug hook, then read the run back with a Trial.

The data are synthetic 12x12 images (no download): each of 4 classes is a bar in one
orientation, drawn at a random position, with noise. The hook saves

* the loss at every step (``losses``: TensorBoard scalars too),
* weights, biases and gradients every ``--interval`` steps,
* the min, max, mean and L2 norm of every gradient at every step (a custom collection
  with its own save and reduction configs: cheap, and enough to watch training),
* an evaluation pass every 100 steps (EVAL mode, from ``model.eval()``),

and writes TensorBoard files (``<out-dir>/tensorboard``). The Trial then prints the
steps, the loss curve and the gradient norms, and saves ``<out-dir>/training.png`` when
matplotlib is installed. A few seconds on two CPU cores:

    python examples/pytorch/train_cnn.py --out-dir /tmp/cnn_run
"""
import argparse
import os
import tempfile

import torch

import smdebug.pytorch as smd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--interval", type=int, default=50, help="save whole tensors every N steps")
    return parser.parse_args()


class BarNet(torch.nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 3 * 3, classes)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic_batch(gen, batch=32, size=12):
    """Bars (horizontal, vertical, two diagonals) at random positions, plus noise."""
    labels = torch.randint(0, 4, (batch,), generator=gen)
    images = 0.3 * torch.randn(batch, 1, size, size, generator=gen)
    offsets = torch.randint(2, size - 2, (batch,), generator=gen)
    idx = torch.arange(size)
    for i, (label, k) in enumerate(zip(labels.tolist(), offsets.tolist())):
        if label == 0:
            images[i, 0, k, :] += 1.0
        elif label == 1:
            images[i, 0, :, k] += 1.0
        elif label == 2:
            images[i, 0, idx, idx] += 1.0
        else:
            images[i, 0, idx, size - 1 - idx] += 1.0
    return images, labels


def train(out_dir, steps, interval):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model, loss_fn = BarNet(), torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    hook = smd.Hook(out_dir=out_dir, export_tensorboard=True,
                    save_config=smd.SaveConfig(mode_save_configs={
                        smd.modes.TRAIN: smd.SaveConfigMode(save_interval=interval),
                        smd.modes.EVAL: smd.SaveConfigMode(save_interval=1)}),
                    include_collections=["weights", "biases", "gradients", "losses", "gradient_norms"])
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=1)
    norms = hook.get_collection("gradient_norms")
    norms.include("^gradient/")
    norms.save_config = smd.SaveConfig(save_interval=1)
    norms.reduction_config = smd.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"])
    norms.save_histogram = False
    hook.register_module(model)
    hook.register_loss(loss_fn)

    eval_data = [synthetic_batch(gen) for _ in range(3)]
    for step in range(steps):
        model.train()
        x, y = synthetic_batch(gen)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if (step + 1) % 100 == 0:
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(ex).argmax(1) == ey).sum()) for ex, ey in eval_data)
            print(f"step {step + 1}: loss {loss.item():.3f}, eval accuracy {correct / 96:.2f}")
    hook.close()


def analyse(out_dir):
    trial = smd.create_trial(out_dir)
    train_steps = trial.steps(mode=smd.modes.TRAIN)
    print(f"\n{len(trial.steps())} saved steps: {len(train_steps)} TRAIN, "
          f"{len(trial.steps(mode=smd.modes.EVAL))} EVAL; collections: {sorted(trial.collections())}")

    loss = trial.tensor("CrossEntropyLoss_output_0")
    curve = {s: loss.value(s, mode=smd.modes.TRAIN).item() for s in loss.steps(mode=smd.modes.TRAIN)}
    print("loss (TRAIN step: value):", ", ".join(f"{s}: {v:.3f}" for s, v in list(curve.items())[::50]))

    grads = sorted(trial.tensor_names(collection="gradient_norms"))
    print(f"\n{'gradient L2 norm at TRAIN step':<30}" + "".join(f"{s:>9}" for s in train_steps[::60]))
    norm_curves = {}
    for name in grads:
        tensor = trial.tensor(name)
        norm_curves[name] = [float(tensor.reduction_value(s, "l2", mode=smd.modes.TRAIN)) for s in train_steps]
        print(f"{name:<30}" + "".join(f"{v:9.4f}" for v in norm_curves[name][::60]))

    weight = trial.tensor("BarNet_fc.weight")
    saved = weight.steps(mode=smd.modes.TRAIN)
    first, last = (weight.value(s, mode=smd.modes.TRAIN) for s in (saved[0], saved[-1]))
    drift = float(((last - first) ** 2).sum() ** 0.5)
    print(f"\nBarNet_fc.weight moved by {drift:.3f} (L2) between TRAIN steps {saved[0]} and {saved[-1]}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, (ax_loss, ax_grad) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(list(curve), list(curve.values()))
    ax_loss.set(title="training loss", xlabel="TRAIN step", yscale="log")
    for name, values in norm_curves.items():
        ax_grad.plot(train_steps, values, label=name.replace("gradient/BarNet_", ""))
    ax_grad.set(title="gradient L2 norm", xlabel="TRAIN step", yscale="log")
    ax_grad.legend(fontsize="small")
    fig.tight_layout()
    path = os.path.join(out_dir, "training.png")
    fig.savefig(path, dpi=80)
    print(f"plot saved to {path}")


def main():
    args = parse_args()
    out_dir = args.out_dir or os.path.join(tempfile.mkdtemp(prefix="smdebug_cnn_"), "run")
    train(out_dir, args.steps, args.interval)
    analyse(out_dir)
    print(f"\nrun directory: {out_dir} (tensorboard --logdir {out_dir}/tensorboard)")


if __name__ == "__main__":
    main()

"""Train a small Gluon MLP with the smdebug hook, then read the run back with a Trial.

The hook saves the loss, the weights and biases and the gradients every ``--interval``
steps, plus the mean and L2 norm of every weight (TRAIN), and the loss of each
evaluation pass (EVAL). The Trial then prints the loss curve and how the first layer's
weight norm and gradient norm evolve. Runs in a few seconds on a CPU:

    python examples/mxnet/train_gluon.py --out-dir /tmp/mxnet_run
"""
import argparse
import tempfile

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import smdebug.mxnet as smd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--epochs", type=int, default=4, help="passes over the training data")
    parser.add_argument("--interval", type=int, default=10, help="save every N steps")
    parser.add_argument("--hybridize", action="store_true", help="hybridize the network (faster; layer "
                        "outputs inside it can no longer be saved)")
    return parser.parse_args()


def synthetic_data(n=2000, features=10, classes=3, seed=7):
    """Overlapping clouds around three centres: learnable, but not at once."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.6, size=(classes, features))
    labels = rng.integers(0, classes, n)
    points = centres[labels] + rng.normal(size=(n, features))
    return points.astype(np.float32), labels.astype(np.float32)


def train(out_dir, epochs, interval, hybridize):
    x, y = synthetic_data()
    train_data = gluon.data.DataLoader(gluon.data.ArrayDataset(x[:1600], y[:1600]), batch_size=64, shuffle=True)
    valid_data = gluon.data.DataLoader(gluon.data.ArrayDataset(x[1600:], y[1600:]), batch_size=200)

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})

    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=interval),
        include_collections=[smd.CollectionKeys.WEIGHTS, smd.CollectionKeys.BIASES, smd.CollectionKeys.GRADIENTS,
                             smd.CollectionKeys.LOSSES],
        reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True),
    )
    hook.register_block(net)  # each forward call of `net` is one step
    hook.register_loss(loss_fn)  # its output goes to the `losses` collection

    for epoch in range(epochs):
        hook.set_mode(smd.modes.TRAIN)
        for batch, labels in train_data:
            with autograd.record():
                loss = loss_fn(net(batch), labels)
            loss.backward()
            trainer.step(batch.shape[0])
        hook.set_mode(smd.modes.EVAL)
        correct = 0.0
        for batch, labels in valid_data:
            output = net(batch)
            loss_fn(output, labels)  # saved as the EVAL loss
            correct += float((output.argmax(axis=1) == labels).sum().asscalar())
        print(f"epoch {epoch}: validation accuracy {correct / 400:.3f}")
    hook.close()


def report(out_dir):
    trial = smd.create_trial(out_dir)
    loss_name = trial.tensor_names(collection="losses")[0]
    loss = trial.tensor(loss_name)
    print(f"\n{len(trial.steps())} saved steps in {out_dir}; tensors: {', '.join(trial.tensor_names())}")
    print(f"\n{loss_name} (mean over the batch), TRAIN:")
    for step in loss.steps(mode=smd.modes.TRAIN):
        print(f"  step {step:4d}  {loss.value(step, mode=smd.modes.TRAIN).mean():.4f}")
    weight, grad = trial.tensor("dense0_weight"), trial.tensor("gradient/dense0_weight")
    print("\ndense0_weight l2 norm (saved reduction) and its gradient's l2 norm (computed on read):")
    for step in weight.steps(mode=smd.modes.TRAIN):
        w = weight.reduction_value(step, "l2", mode=smd.modes.TRAIN)
        g = grad.reduction_value(step, "l2", mode=smd.modes.TRAIN)
        print(f"  step {step:4d}  weight {float(w):8.4f}  gradient {float(g):8.5f}")


def main():
    args = parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="smdebug_mxnet_")
    train(out_dir, args.epochs, args.interval, args.hybridize)
    report(out_dir)


if __name__ == "__main__":
    main()

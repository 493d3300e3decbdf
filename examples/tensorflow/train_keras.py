"""Train a small Keras 3 model with the smdebug KerasHook, then read the run back.

The data are synthetic (no download): 2,000 points in 8 dimensions, labelled by which
side of two random hyperplanes they fall on (4 classes). ``model.fit`` runs with a
validation split, then ``model.evaluate`` on held-out data. The hook saves

* the Keras logs at every step (``losses``: ``loss``; ``metrics``: ``accuracy``; and
  ``val_loss``/``val_accuracy`` in the last EVAL step of each validation run),
* weights, biases and gradients every ``--interval`` TRAIN steps,
* the L2 norm and mean of every gradient at every TRAIN step (a custom collection with
  its own save and reduction configs: cheap, and enough to watch training),

and writes TensorBoard files (``<out-dir>/tensorboard``). The Trial then prints the
steps of each mode, the loss curve and the norm of the first layer's kernel. A few
seconds after TensorFlow is imported:

    python examples/tensorflow/train_keras.py --out-dir /tmp/keras_run
"""
import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import smdebug.tensorflow as smd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--interval", type=int, default=20, help="save whole tensors every N TRAIN steps")
    return parser.parse_args()


PLANES = np.random.default_rng(42).standard_normal((8, 2))


def synthetic_data(n=2000, seed=0):
    """Points and their class: which side of each of the two PLANES they are on."""
    x = np.random.default_rng(seed).standard_normal((n, 8)).astype("float32")
    y = ((x @ PLANES) > 0).astype("int64") @ np.array([1, 2])
    return x, y


def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(32, activation="relu", name="hidden"),
        keras.layers.Dense(4, name="logits"),
    ], name="planes")
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def main():
    args = parse_args()
    out_dir = args.out_dir or os.path.join(tempfile.mkdtemp(prefix="smdebug_keras_"), "run")
    x, y = synthetic_data()
    x_test, y_test = synthetic_data(400, seed=1)

    hook = smd.KerasHook(
        out_dir=out_dir,
        export_tensorboard=True,
        save_config=smd.SaveConfig(mode_save_configs={
            smd.modes.TRAIN: smd.SaveConfigMode(save_interval=args.interval),
            smd.modes.EVAL: smd.SaveConfigMode(save_interval=1),
        }),
        include_collections=["weights", "biases", "gradients", "gradient_norms"],
    )
    # Losses and metrics at every step, whatever the hook's interval.
    for name in ("losses", "metrics"):
        hook.get_collection(name).save_config = smd.SaveConfig(save_interval=1)
    norms = hook.get_collection("gradient_norms")
    norms.include("^gradients/")
    norms.save_config = smd.SaveConfig(save_interval=1)
    norms.reduction_config = smd.ReductionConfig(reductions=["mean"], norms=["l2"])

    model = build_model()
    model.fit(x, y, batch_size=64, epochs=args.epochs, validation_split=0.2, callbacks=[hook], verbose=0)
    test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=100, callbacks=[hook], verbose=0)
    hook.close()
    print(f"wrote {out_dir}; test loss {test_loss:.3f}, accuracy {test_accuracy:.3f}")

    trial = smd.create_trial(out_dir)
    for mode in (smd.modes.TRAIN, smd.modes.EVAL):
        steps = trial.steps(mode=mode)
        print(f"{mode.name}: {len(steps)} saved steps (mode steps {steps[0]}..{steps[-1]})")
    loss = trial.tensor("loss")
    train_steps = loss.steps(mode=smd.modes.TRAIN)
    curve = [loss.value(s, mode=smd.modes.TRAIN).item() for s in train_steps]
    every = max(1, len(curve) // 10)
    print("TRAIN loss (Keras' running mean per epoch):",
          " ".join(f"{s}:{v:.3f}" for s, v in zip(train_steps[::every], curve[::every])))
    print("val_loss per epoch:", [round(float(v), 3) for v in trial.tensor("val_loss").values().values()])
    kernel = trial.tensor("hidden/weights/planes/hidden/kernel")
    for step in kernel.steps(mode=smd.modes.TRAIN)[:: max(1, len(kernel.steps(mode=smd.modes.TRAIN)) // 5)]:
        print(f"TRAIN step {step:4d}: |hidden kernel| = {np.linalg.norm(kernel.value(step, mode=smd.modes.TRAIN)):.3f}, "
              f"|gradient| = {float(trial.tensor('gradients/planes/hidden/kernelGrad').reduction_value(step, 'l2', mode=smd.modes.TRAIN)):.4f}")


if __name__ == "__main__":
    main()

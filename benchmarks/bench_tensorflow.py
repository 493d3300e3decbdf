"""Overhead of the KerasHook on ``model.fit``: hooked fit time / the same fit without a hook.

Run::

    .venv/bin/python benchmarks/bench_tensorflow.py               # all scenarios
    .venv/bin/python benchmarks/bench_tensorflow.py --reps 9 --steps 128 --scenarios default
    .venv/bin/python benchmarks/bench_tensorflow.py --dry-run     # everything but the writer

Scenarios (a small CNN on 28x28 inputs, batch 32, TensorFlow on the CPU):

a. ``reductions``: min, max, mean, std, l1 and l2 norms of weights, biases and gradients
   at every step (no whole tensors);
b. ``full``: whole weights, biases and gradients at every step;
c. ``default``: the default configuration (losses and metrics every 500 steps).

For each scenario a baseline model and a hooked model (same architecture, both traced by
a warm-up fit) alternate ``--reps`` times in one process; each hooked fit is followed by
a flush of the writer inside the timing, so the time includes writing everything that
fit saved. The table shows ``min ratio``, the fastest hooked fit over the fastest
baseline fit (on a shared machine fit times jump between levels: the minimum is the
stable figure), the median of the per-pair ratios, and the fastest step times.
Targets on CPU: a <= 1.15, c <= 1.02.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402

PARAMS = ["weights", "biases", "gradients"]


def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", name="fc1"),
        keras.layers.Dense(10, name="fc2"),
    ], name="cnn")
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def make_hook(scenario, out_dir, dry_run=False):
    every_step = smd.SaveConfig(save_interval=1)
    if scenario == "reductions":
        return smd.KerasHook(out_dir=out_dir, save_config=every_step, include_collections=PARAMS, dry_run=dry_run,
                             reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"],
                                                                  norms=["l1", "l2"]))
    if scenario == "full":
        return smd.KerasHook(out_dir=out_dir, save_config=every_step, include_collections=PARAMS, dry_run=dry_run)
    if scenario == "default":
        return smd.KerasHook(out_dir=out_dir, dry_run=dry_run)
    raise ValueError(f"unknown scenario {scenario!r}")


def timed_fit(model, x, y, batch, callbacks=(), hook=None):
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, callbacks=list(callbacks), verbose=0)
    if hook is not None and hook.writer is not None:
        hook.writer.flush()
    return time.perf_counter() - start


def run_scenario(scenario, x, y, batch, reps, tmp, dry_run=False):
    out_dir = os.path.join(tmp, scenario)
    baseline, hooked = build_model(), build_model()
    hook = make_hook(scenario, out_dir, dry_run)
    timed_fit(baseline, x, y, batch)  # warm-up: traces the compiled steps
    timed_fit(hooked, x, y, batch, [hook], hook)
    base_times, hook_times, ratios = [], [], []
    for _ in range(reps):
        b = timed_fit(baseline, x, y, batch)
        h = timed_fit(hooked, x, y, batch, [hook], hook)
        base_times.append(b)
        hook_times.append(h)
        ratios.append(h / b)
    hook.close()
    assert hook.enabled, "the hook switched itself off during the benchmark"
    return min(hook_times) / min(base_times), statistics.median(ratios), min(base_times), min(hook_times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9, help="baseline/hooked pairs per scenario")
    parser.add_argument("--steps", type=int, default=64, help="batches per fit")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--scenarios", nargs="+", default=["reductions", "full", "default"])
    parser.add_argument("--dry-run", action="store_true",
                        help="hooks capture and reduce but write nothing: the writer's share is the difference")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.standard_normal((n, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, n)
    tmp = tempfile.mkdtemp(prefix="bench_tensorflow_")
    try:
        print(f"{'scenario':<12} {'min ratio':>9} {'median ratio':>13} {'base ms/step':>13} {'hooked ms/step':>15}")
        for scenario in args.scenarios:
            ratio, median, base, hooked = run_scenario(scenario, x, y, args.batch, args.reps, tmp, args.dry_run)
            print(f"{scenario:<12} {ratio:9.3f} {median:13.3f} {1e3 * base / args.steps:13.2f} "
                  f"{1e3 * hooked / args.steps:15.2f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

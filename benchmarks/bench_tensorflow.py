"""Overhead of the KerasHook on ``model.fit``: hooked fit time / the same fit without a hook.

Run::

    .venv/bin/python benchmarks/bench_tensorflow.py               # all scenarios
    .venv/bin/python benchmarks/bench_tensorflow.py --reps 9 --steps 128 --scenarios default
    .venv/bin/python benchmarks/bench_tensorflow.py --dry-run     # everything but the writer
    .venv/bin/python benchmarks/bench_tensorflow.py --width 2     # the same tensors, longer steps
    .venv/bin/python benchmarks/bench_tensorflow.py --alternate 64 --steps 256 --reps 3 --depth 36 \
        --scenarios control reductions                               # 160 tensors saved
    .venv/bin/python benchmarks/bench_tensorflow.py --alternate 64 --steps 256 --reps 4 \
        --scenarios control reductions full default idle             # steadiest on a noisy machine
    .venv/bin/python benchmarks/bench_tensorflow.py --alternate 64 --steps 256 --reps 3 --batch 128 \
        --scenarios control reductions                               # longer steps (8-10 ms here)

Scenarios (a small CNN on 28x28 inputs, batch 32, TensorFlow on the CPU):

a. ``reductions``: min, max, mean, std, l1 and l2 norms of weights, biases and gradients
   at every step (no whole tensors);
b. ``full``: whole weights, biases and gradients at every step;
c. ``default``: the default configuration (losses and metrics every 500 steps).
d. ``updates``: (a) with the ``updates`` collection (after minus before the optimizer's
   ``apply``, in the compiled step) in place of the gradients;
e. ``health``: the README's training-health configuration: weights, biases and updates,
   their L2 norms and health reductions (nonfinite, zero_fraction, kurtosis, fp8/bf16
   over/underflow) every 100 steps.

``--depth k`` inserts k more Dense(128) layers after ``fc1``: 4k more tensors saved (weights,
biases and their gradients), for the hook's cost per tensor (its callbacks' columns).
``--width k`` multiplies the CNN's filters and units by k: the same 16 tensors are saved,
each step does more work (the ratio of a fixed cost per saved step falls; the column
``added ms/step`` shows the hook's cost in time).

With ``--alternate``, scenarios that add one part of (a) at a time show where its
overhead goes:

- ``control``: no hook at all (the measurement's own error: ideally 1.0);
- ``idle``: the hook of (a) attached, saving nothing (``save_interval`` past the run):
  its capture sites in the train step and its callbacks on steps that save nothing;
- ``reductions --dry-run``: (a) without the writer;
- ``writer``: no hook; a callback hands a RunWriter a step of as many reduction records
  as (a) saves, every batch (the writer alone);
- ``files``: no hook; a thread makes the directory and creates and renames the two
  files that each saved step needs (docs/format.md 1.2 and 1.4), nothing else.

For each scenario a baseline model and a hooked model (same architecture, both traced by
a warm-up fit) alternate ``--reps`` times in one process; each hooked fit is followed by
a flush of the writer inside the timing, so the time includes writing everything that
fit saved. The table shows ``min ratio``, the fastest hooked fit over the fastest
baseline fit (on a shared machine fit times jump between levels: the minimum is the
stable figure), the median of the per-pair ratios, and the fastest step times.
Targets on CPU: a <= 1.15, c <= 1.02.

``--alternate 8`` is for a machine whose speed changes within seconds (a shared 2-vCPU VM
runs the same baseline block of 16 steps anywhere between 10.6 and 14.4 ms a step):
whole fits measured one after the other then see different speeds. Instead both models
train on the same data in fits of 8 batches taken in turn (which model goes first
swaps every block), ``--reps`` passes over ``--steps`` batches. Timing callbacks, first
and last in the list, time each fit from its first batch's begin to its last batch's end:
every train step and every callback count; Keras' per-fit setup and end of epoch (the
same for both models, and tens of milliseconds) do not. Each hooked block ends with a flush
of the writer, counted against the hook: the writer's work never spills into the baseline's
next block. The table shows the pooled ratio (all hooked time / all
baseline time) with a bootstrap 95% interval over the blocks (it does not see drifts
slower than a block: rerun to see those), the median of the per-block ratios, and the
time spent in the hook's own batch begin and end callbacks per step (:class:`CallbackClock`).
Scenario ``control`` attaches no hook to the second model: its ratio is the
measurement's own error (ideally 1.0).

The writer wakes for batches of ``WAKE_AFTER_ITEMS`` (16) steps (``smdebug.storage.writer.run_writer``).
With blocks shorter than that, every block's writing happens in its closing flush, while
training waits, which is cheaper than writing beside training and flatters the hook: use
blocks of 64 or more (``--alternate 64 --steps 256``), where most of the writing overlaps
training as in a long fit.
"""
from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import smdebug.tensorflow as smd

PARAMS = ["weights", "biases", "gradients"]


def build_model(width=1, depth=0):
    """The CNN; ``width`` multiplies its filters and units (the same tensors, more work per
    step); ``depth`` adds Dense(128) layers after ``fc1`` (more tensors)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16 * width, 3, activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32 * width, 3, activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128 * width, activation="relu", name="fc1"),
        *[keras.layers.Dense(128, activation="relu", name=f"deep{i}") for i in range(depth)],
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
    if scenario == "updates":
        return smd.KerasHook(out_dir=out_dir, save_config=every_step, include_collections=["weights", "biases", "updates"],
                             dry_run=dry_run, reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"],
                                                                                   norms=["l1", "l2"]))
    if scenario == "health":
        health = smd.ReductionConfig(norms=["l2"], reductions=["nonfinite", "zero_fraction", "kurtosis",
                                                               "overflow_fp8_e4m3", "underflow_bf16"])
        return smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=100), dry_run=dry_run,
                             include_collections=["weights", "biases", "updates"], reduction_config=health)
    if scenario == "idle":
        return smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(start_step=10 ** 9),
                             include_collections=PARAMS, dry_run=dry_run,
                             reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"],
                                                                  norms=["l1", "l2"]))
    if scenario == "writer":
        return WriterAlone(out_dir)
    if scenario == "files":
        return FilesAlone(out_dir)
    raise ValueError(f"unknown scenario {scenario!r}")


class WriterAlone(keras.callbacks.Callback):
    """No hook: hands a RunWriter a step of 16 x 6 float64 reduction records every batch."""

    def __init__(self, out_dir):
        super().__init__()
        from smdebug.storage.writer import RunWriter, StepData

        self._step_data = StepData
        self.writer = RunWriter(out_dir, "worker_0")
        self.enabled = True
        self._step = 0
        self._records = [(f"smdebug/reductions/{op}/tensor_{i}", np.asarray(float(i)))
                         for i in range(16) for op in ("min", "max", "mean", "std", "l1", "l2")]

    def on_train_batch_end(self, batch, logs=None):
        self.writer.submit(self._step_data(global_step=self._step, mode="TRAIN", mode_step=self._step,
                                           worker="worker_0", tensors=self._records, shapes=[], tb_scalars=[],
                                           tb_histograms=[], wall_time=time.time()), publish=True)
        self._step += 1

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


class FilesAlone(keras.callbacks.Callback):
    """No hook: a thread makes each batch's step directory and writes, then renames, its two files."""

    def __init__(self, out_dir):
        super().__init__()
        self.enabled = True
        self._dir = out_dir
        self._queue = queue.Queue()
        self._step = 0
        self.writer = self  # flush(): wait for the thread, like a RunWriter's
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        blob = bytes(9000)  # about a step of (a): its event file and its index are ~9 kB each
        while True:
            step = self._queue.get()
            events = os.path.join(self._dir, "events", f"{step:012d}")
            index = os.path.join(self._dir, "index", f"{step // 1000:09d}")
            os.makedirs(events)
            os.makedirs(index, exist_ok=True)  # a stat after the first step of each thousand
            for path in (os.path.join(events, f"{step:012d}_worker_0.tfevents"),
                         os.path.join(index, f"{step:012d}_worker_0.json")):
                with open(path + ".tmp", "wb") as handle:
                    handle.write(blob)
                os.replace(path + ".tmp", path)
            self._queue.task_done()

    def on_train_batch_end(self, batch, logs=None):
        self._queue.put(self._step)
        self._step += 1

    def flush(self):
        self._queue.join()

    def close(self):
        self.flush()


def timed_fit(model, x, y, batch, callbacks=(), hook=None):
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, callbacks=list(callbacks), verbose=0)
    if hook is not None and getattr(hook, "writer", None) is not None:
        hook.flush()
    return time.perf_counter() - start


class BlockTimer:
    """Times the batches of one fit: from the first ``on_train_batch_begin`` (``first``, put
    first in the callback list) to the last ``on_train_batch_end`` (``last``, put last), so
    every train step and every callback of every batch count, and neither Keras' per-fit
    setup nor the end of its epoch (tens of milliseconds, the same for both models) does."""

    def __init__(self, batches):
        self.start = self.stop = None
        timer = self

        class First(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == 0:
                    timer.start = time.perf_counter()

        class Last(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == batches - 1:
                    timer.stop = time.perf_counter()

        self.first, self.last = First(), Last()

    @property
    def seconds(self):
        return self.stop - self.start


def alternating_blocks(models, hook, x, y, batch, block):
    """Both models train on all of ``x`` in fits of ``block`` batches taken in turn.

    Returns ``[(baseline seconds, hooked seconds), ...]``, one pair per block of data. A
    hooked block's time includes the writer flush that ends it.
    """
    pairs = []
    size = block * batch
    writer = hook if getattr(hook, "writer", None) is not None else None  # flush(): steps and files done
    for index, first in enumerate(range(0, len(x), size)):
        seconds = [0.0, 0.0]
        for which in ((0, 1) if index % 2 == 0 else (1, 0)):  # neither model always goes first
            timer = BlockTimer(block)
            hooks = [hook] if which == 1 and hook is not None else []
            models[which].fit(x[first:first + size], y[first:first + size], batch_size=batch, epochs=1,
                              shuffle=False, callbacks=[timer.first, *hooks, timer.last], verbose=0)
            seconds[which] = timer.seconds
            if hooks and writer is not None:
                start = time.perf_counter()
                writer.flush()
                seconds[which] += time.perf_counter() - start
        pairs.append(tuple(seconds))
    return pairs


def pooled_ratio(pairs, resamples=2000):
    """Total hooked time / total baseline time, with a bootstrap 95% interval over the block pairs."""
    pairs = np.asarray(pairs)
    ratio = pairs[:, 1].sum() / pairs[:, 0].sum()
    picks = np.random.default_rng(0).integers(0, len(pairs), (resamples, len(pairs)))
    sums = pairs[picks].sum(axis=1)
    boot = sums[:, 1] / sums[:, 0]
    return ratio, np.percentile(boot, 2.5), np.percentile(boot, 97.5)


def run_scenario(scenario, x, y, batch, reps, tmp, dry_run=False, model_args=None):
    out_dir = os.path.join(tmp, scenario)
    baseline, hooked = build_model(**(model_args or {})), build_model(**(model_args or {}))
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


class CallbackClock:
    """Times the hook's own ``on_train_batch_begin`` / ``on_train_batch_end`` inside ``fit``
    (instance attributes wrap the bound methods Keras calls). Steadier than the ratio: the
    time spent in the hook's Python does not depend on the machine's speed between blocks."""

    def __init__(self, hook):
        self.seconds = {"begin": 0.0, "end": 0.0}
        self.calls = 0
        for which, name in (("begin", "on_train_batch_begin"), ("end", "on_train_batch_end")):
            setattr(hook, name, self._timed(which, getattr(hook, name)))

    def _timed(self, which, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[which] += time.perf_counter() - start
                self.calls += which == "end"
        return timed

    def per_step_us(self, which):
        return 1e6 * self.seconds[which] / self.calls if self.calls else float("nan")


def run_alternating(scenario, x, y, batch, reps, tmp, dry_run, block, model_args=None):
    baseline, hooked = build_model(**(model_args or {})), build_model(**(model_args or {}))
    hook = None if scenario == "control" else make_hook(scenario, os.path.join(tmp, scenario), dry_run)
    for _ in range(2):  # warm-up: traces the compiled steps and the block-sized data pipelines
        alternating_blocks([baseline, hooked], hook, x, y, batch, block)
    clock = CallbackClock(hook) if hook is not None else None
    pairs = []
    for _ in range(reps):
        pairs += alternating_blocks([baseline, hooked], hook, x, y, batch, block)
    if hook is not None:
        hook.close()
        assert hook.enabled, "the hook switched itself off during the benchmark"
    ratio, low, high = pooled_ratio(pairs)
    steps = len(pairs) * block
    return {"ratio": ratio, "low": low, "high": high,
            "median_block_ratio": statistics.median(h / b for b, h in pairs),
            "base_ms": 1e3 * sum(b for b, _ in pairs) / steps,
            "hooked_ms": 1e3 * sum(h for _, h in pairs) / steps,
            "begin_us": clock.per_step_us("begin") if clock else float("nan"),
            "end_us": clock.per_step_us("end") if clock else float("nan")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9, help="baseline/hooked pairs per scenario")
    parser.add_argument("--steps", type=int, default=64, help="batches per fit")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--scenarios", nargs="+", default=["reductions", "full", "default"])
    parser.add_argument("--dry-run", action="store_true",
                        help="hooks capture and reduce but write nothing: the writer's share is the difference")
    parser.add_argument("--alternate", type=int, default=0, metavar="BLOCK",
                        help="alternate fits of BLOCK batches of the two models (steadier on a noisy machine)")
    parser.add_argument("--depth", type=int, default=0,
                        help="add Dense(128) layers after fc1 (4 more tensors saved each)")
    parser.add_argument("--width", type=int, default=1,
                        help="multiply the CNN's filters and units (same tensors saved, longer steps)")
    args = parser.parse_args()
    if "control" in args.scenarios and not args.alternate:
        parser.error("scenario 'control' compares two models without a hook: it needs --alternate BLOCK")

    model_args = {"width": args.width, "depth": args.depth}
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.standard_normal((n, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, n)
    tmp = tempfile.mkdtemp(prefix="bench_tensorflow_")
    try:
        if args.alternate:
            print(f"{'scenario':<12} {'ratio':>7} {'95% interval':>14} {'median block':>13} "
                  f"{'base ms/step':>13} {'hooked ms/step':>15} {'added ms/step':>14} "
                  f"{'hook begin us':>14} {'hook end us':>12}")
            for scenario in args.scenarios:
                r = run_alternating(scenario, x, y, args.batch, args.reps, tmp, args.dry_run, args.alternate,
                                    model_args)
                print(f"{scenario:<12} {r['ratio']:7.3f} {r['low']:7.3f}-{r['high']:.3f} "
                      f"{r['median_block_ratio']:13.3f} {r['base_ms']:13.2f} {r['hooked_ms']:15.2f} "
                      f"{r['hooked_ms'] - r['base_ms']:14.2f} {r['begin_us']:14.0f} {r['end_us']:12.0f}", flush=True)
            return
        print(f"{'scenario':<12} {'min ratio':>9} {'median ratio':>13} {'base ms/step':>13} {'hooked ms/step':>15}")
        for scenario in args.scenarios:
            ratio, median, base, hooked = run_scenario(scenario, x, y, args.batch, args.reps, tmp, args.dry_run,
                                                       model_args)
            print(f"{scenario:<12} {ratio:9.3f} {median:13.3f} {1e3 * base / args.steps:13.2f} "
                  f"{1e3 * hooked / args.steps:15.2f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""What the trainer callbacks cost: step time with DebuggerCallback vs without, per integration.

Run (torch at one intra-op thread, as the figures in docs/performance.md)::

    .venv/bin/python benchmarks/bench_trainers.py
    .venv/bin/python benchmarks/bench_trainers.py --integrations lightning --rounds 7 --steps 60

Scenario: a 6-layer MLP (``--width`` 256: 65k-element weights; 24 weights, biases and
gradients), batches of 64, SGD, trained by a PyTorch Lightning ``Trainer`` and by a
Hugging Face ``Trainer`` (the model takes ``x``/``labels`` and returns ``loss``).
Configurations of the callback:

* ``default``: ``DebuggerCallback(out_dir=...)`` with the hook's defaults (losses every 500
  steps; the trainer's logged values as scalars at its logging interval, every 10 steps);
* ``reductions``: weights, biases, gradients and losses, min/max/mean/std/l2 of each, every
  step;
* ``control``: no callback in either fit (the noise floor of the method: a ratio away from
  1.00 there is the machine, not the callback).

Method: a trainer cannot be stepped one step at a time from outside, so the baseline (no
callback) and the callback run alternate by whole short fits in one process: ``--rounds``
of (baseline fit, callback fit), each of ``--steps`` optimizer steps, same model
architecture, data and seed. Each step is timed from one ``on_train_batch_start`` /
``on_step_begin`` to the next (the whole iteration: every callback, forward, backward,
optimizer step; the smdebug end of step happens inside the next one); the first
``--warmup`` steps of each fit are dropped. Figures: the **median of per-step times** of
each, pooled over rounds, their ratio and the added time per step; and, less sensitive to
a noisy machine, the median per step of the time spent inside the callback's own events
on the training thread ("in callback": not the PyTorch hook's module hooks, nor what the
step pipeline's worker costs the training thread through the GIL); and the median of the
training thread's own CPU time per step (``time.thread_time``: what the callback and the
hook add to that thread's work, not the time it spends waiting for the GIL or for a core,
so it reads the same on a busy machine). Set-up and the hook's
``close()`` are outside the timed steps.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch

BATCH = 64
CONFIGS = ("default", "reductions", "control")


class MLP(torch.nn.Module):
    def __init__(self, width: int, depth: int = 6, classes: int = 10):
        super().__init__()
        layers = []
        for i in range(depth):
            layers += [torch.nn.Linear(width, width if i < depth - 1 else classes)]
            if i < depth - 1:
                layers.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x, labels=None):
        logits = self.net(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def dataset(width: int, n: int):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, width, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def callback_kwargs(smd_module, config: str, out_dir: str) -> dict:
    if config == "default":
        return {"out_dir": out_dir}
    return {"out_dir": out_dir, "include_collections": ["weights", "biases", "gradients", "losses"],
            "save_config": smd_module.SaveConfig(save_interval=1),
            "reduction_config": smd_module.ReductionConfig(reductions=["min", "max", "mean", "std"], norms=["l2"])}


# --- Lightning ------------------------------------------------------------------------------
def lightning_fit(width: int, steps: int, callback_factory):
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = MLP(width)

        def training_step(self, batch, batch_idx):
            loss = self.model(batch[0], batch[1])["loss"]
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Timer(pl.Callback):
        def __init__(self):
            self.starts = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.starts.append((time.perf_counter(), time.thread_time()))

        def on_train_end(self, trainer, pl_module):
            self.starts.append((time.perf_counter(), time.thread_time()))

    x, y = dataset(width, steps * BATCH)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    timer = Timer()
    extra = callback_factory()
    torch.manual_seed(0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
                         callbacks=[timer] + ([extra] if extra is not None else []))
    trainer.fit(Module(), loader)
    return timer.starts, extra


# --- Hugging Face Trainer ---------------------------------------------------------------------
def transformers_fit(width: int, steps: int, callback_factory):
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):
        def __init__(self):
            self.starts = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append((time.perf_counter(), time.thread_time()))

        def on_train_end(self, args, state, control, **kwargs):
            self.starts.append((time.perf_counter(), time.thread_time()))

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.y = dataset(width, steps * BATCH)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.y[i]}

    timer = Timer()
    extra = callback_factory()
    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="bench_hf_")
    args = TrainingArguments(output_dir=work, per_device_train_batch_size=BATCH, num_train_epochs=1,
                             learning_rate=0.01, optim="sgd", report_to=[], save_strategy="no", logging_steps=10,
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, max_grad_norm=0.0,
                             seed=0)
    trainer = Trainer(model=MLP(width), args=args, train_dataset=Data(),
                      callbacks=[timer] + ([extra] if extra is not None else []))
    trainer.remove_callback(PrinterCallback)  # disable_tqdm's stand-in prints every log line
    trainer.train()
    shutil.rmtree(work, ignore_errors=True)
    return timer.starts, extra


INTEGRATIONS = {"lightning": ("smdebug.lightning", lightning_fit),
                "transformers": ("smdebug.transformers", transformers_fit)}


def step_times(starts, warmup, clock=0):
    """Per-step times from the step starts: wall (``clock=0``) or training-thread CPU (1)."""
    times = [b[clock] - a[clock] for a, b in zip(starts, starts[1:])]
    return times[warmup:]


def timed_events(callback, calls: list):
    """Time the trainer events ``callback`` handles (those its class defines; the inherited
    ones do nothing) on the training thread: (start, seconds) to ``calls``."""
    for name in vars(type(callback)):
        if not name.startswith("on_"):
            continue
        method = getattr(callback, name)

        def timed(*args, _method=method, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                calls.append((start, time.perf_counter() - start))

        setattr(callback, name, timed)
    return callback


def callback_time_per_step(starts, calls, warmup):
    """The callback's own time in each timed step (its events between two step starts)."""
    spans = list(zip([s[0] for s in starts], [s[0] for s in starts[1:]]))[warmup:]
    per_step = [0.0] * len(spans)
    for start, seconds in calls:
        for i, (a, b) in enumerate(spans):
            if a <= start < b:
                per_step[i] += seconds
                break
    return per_step


def bench(integration: str, config: str, width: int, steps: int, rounds: int, warmup: int, work_dir: str):
    import importlib

    smd_module = importlib.import_module(INTEGRATIONS[integration][0])
    fit = INTEGRATIONS[integration][1]
    base, hooked, own, base_cpu, hooked_cpu = [], [], [], [], []
    for r in range(rounds):
        # ABBA: which fit of a round runs first alternates (the second of two fits runs warmer)
        for with_callback in ((False, True) if r % 2 == 0 else (True, False)):
            if not with_callback:
                starts, _ = fit(width, steps, lambda: None)
                base += step_times(starts, warmup)
                base_cpu += step_times(starts, warmup, clock=1)
                continue
            out_dir = os.path.join(work_dir, f"{integration}_{config}_{r}")
            calls: list = []
            factory = (lambda: None) if config == "control" else (
                lambda: timed_events(smd_module.DebuggerCallback(**callback_kwargs(smd_module, config, out_dir)), calls))
            starts, callback = fit(width, steps, factory)
            hooked += step_times(starts, warmup)
            hooked_cpu += step_times(starts, warmup, clock=1)
            own += callback_time_per_step(starts, calls, warmup)
            if callback is not None:
                callback.close()
            shutil.rmtree(out_dir, ignore_errors=True)
    b, h = statistics.median(base), statistics.median(hooked)
    bc, hc = statistics.median(base_cpu), statistics.median(hooked_cpu)
    return {"integration": integration, "config": config, "base_ms": b * 1e3, "hooked_ms": h * 1e3,
            "ratio": h / b, "added_ms": (h - b) * 1e3, "steps": len(hooked),
            "cpu_ratio": hc / bc, "cpu_added_ms": (hc - bc) * 1e3,
            "callback_us": statistics.median(own) * 1e6 if own else 0.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--integrations", default="lightning,transformers")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per fit")
    parser.add_argument("--rounds", type=int, default=5, help="alternating (baseline, callback) fits")
    parser.add_argument("--warmup", type=int, default=5, help="steps dropped at the start of each fit")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    work_dir = tempfile.mkdtemp(prefix="bench_trainers_")
    print(f"# {args.width}-wide 6-layer MLP, batch {BATCH}, torch threads {args.threads}, {args.rounds} rounds x "
          f"{args.steps} steps (first {args.warmup} of each dropped); median per-step times")
    print(f"{'integration':<13} {'config':<11} {'no callback':>12} {'callback':>10} {'ratio':>6} {'added':>9} "
          f"{'in callback':>12} {'thread CPU':>11} {'CPU added':>10}")
    try:
        for integration in args.integrations.split(","):
            for config in args.configs.split(","):
                r = bench(integration, config, args.width, args.steps, args.rounds, args.warmup, work_dir)
                print(f"{r['integration']:<13} {r['config']:<11} {r['base_ms']:>9.2f} ms {r['hooked_ms']:>7.2f} ms "
                      f"{r['ratio']:>5.2f}x {r['added_ms']:>+6.2f} ms {r['callback_us']:>9.0f} us "
                      f"{r['cpu_ratio']:>10.2f}x {r['cpu_added_ms']:>+7.2f} ms", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

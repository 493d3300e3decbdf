"""What forwarding to W&B costs, against the hook alone and against ``wandb.watch``, in one
process and one W&B run (offline): four copies of the same PyTorch model trained side by side,

    base     no instrumentation
    hook     smd.Hook: the L2 norm, mean and max of every weight and gradient, every step
    sink     the same hook + ``hook.add_sink(smd.sinks.WandbSink())``
    watch    ``wandb.watch(model, log="all", log_freq=1)`` + ``wandb.log({"loss": ...})``

in blocks of ``--block`` steps, the arms' order rotating per round. A block's steps are timed
one by one (the training thread's view); after the block, what the arm left in the background
(the hook's reductions and writer, the sink's thread, wandb's serialization) is waited for and
timed too, so background work cannot bill another arm's block. Printed per arm, over ``base``:
the median step; the step plus its share of that drain; and the process's CPU time per step,
every thread's, drain included (the steadiest of the three on a loaded machine: other
processes do not count; wandb's own service process does not either). ``sink - hook`` is the
forwarding's own cost (the issue's target: at most 0.05x).

    WANDB_MODE=offline WANDB_DIR=/tmp/w python benchmarks/bench_trackers.py --model mlp count370
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

import smdebug.pytorch as smd
from smdebug.sinks import WandbSink

MODELS = {  # name: (widths of the layers, batch)
    "mlp": ([256, 512, 512, 512, 512, 512, 10], 64),  # 12 tensors of 0.13-0.26 M values
    "count370": ([32] * 186, 16),  # 370 small tensors (185 Linear layers of 32x32)
}


def make_model(name: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    widths, _ = MODELS[name]
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


class Arm:
    def __init__(self, kind: str, model_name: str, out_root: str, run):
        self.kind = kind
        self.model = make_model(model_name, 0)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.hook = None
        self.sink = None
        self.run = run
        self.steps, self.drains, self.block_steps, self.cpu = [], [], 0, 0.0
        if kind in ("hook", "sink"):
            self.hook = smd.Hook(out_dir=os.path.join(out_root, model_name, kind), save_config=smd.SaveConfig(save_interval=1),
                                 include_collections=["weights", "gradients", "losses"],
                                 reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]))
            self.hook.register_module(self.model)
            self.hook.register_loss(self.loss_fn)
            if kind == "sink":
                self.sink = WandbSink(run=run)
                self.hook.add_sink(self.sink)
        elif kind == "watch":
            import wandb

            wandb.watch(self.model, log="all", log_freq=1)

    def step(self, x, y) -> None:
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        if self.kind == "watch":
            self.run.log({"watch/loss": loss.item()})  # what commits watch's histograms, as users do

    def drain(self) -> None:
        if self.hook is not None:
            self.hook.flush()
        if self.sink is not None:
            self.sink.wait_idle(60)

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()


def bench(model_name: str, rounds: int, block: int, out_root: str, run) -> dict:
    widths, batch = MODELS[model_name]
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(batch, widths[0], generator=gen), torch.randint(0, widths[-1], (batch,), generator=gen))
            for _ in range(8)]
    arms = [Arm(kind, model_name, out_root, run) for kind in ("base", "hook", "sink", "watch")]
    for arm in arms:  # warm-up: first calls, traced paths, wandb's first rows
        for i in range(5):
            arm.step(*data[i % len(data)])
        arm.drain()
    for r in range(rounds):
        for arm in arms[r % 4:] + arms[:r % 4]:
            cpu = time.process_time()
            for i in range(block):
                x, y = data[i % len(data)]
                t0 = time.perf_counter()
                arm.step(x, y)
                arm.steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            arm.drain()
            arm.drains.append(time.perf_counter() - t0)
            arm.cpu += time.process_time() - cpu
            arm.block_steps += block
    for arm in arms:
        arm.close()
    base = statistics.median(arms[0].steps)
    base_cpu = arms[0].cpu / arms[0].block_steps
    out = {}
    for arm in arms:
        median = statistics.median(arm.steps)
        with_drain = median + sum(arm.drains) / arm.block_steps
        out[arm.kind] = (median * 1e3, median / base, with_drain / base, arm.cpu / arm.block_steps / base_cpu)
    out["forwarding"] = (None,) + tuple(a - b for a, b in zip(out["sink"][1:], out["hook"][1:]))
    return out


def main() -> None:
    import wandb

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out_root:
        os.environ.setdefault("WANDB_DIR", out_root)
        run = wandb.init(project="smdebug-bench")
        try:
            for name in args.model:
                rows = bench(name, args.rounds, args.block, out_root, run)
                print(f"\n{name}: {args.rounds} rounds x {args.block} steps per arm")
                print(f"{'arm':<12}{'median ms':>10}{'step/base':>11}{'+drain/base':>13}{'cpu/base':>10}")
                for kind, (ms, ratio, drained, cpu) in rows.items():
                    label = "sink - hook" if kind == "forwarding" else kind
                    ms_text = f"{ms:10.2f}" if ms is not None else " " * 10
                    print(f"{label:<12}{ms_text}{ratio:11.3f}{drained:13.3f}{cpu:10.3f}")
        finally:
            run.finish()


if __name__ == "__main__":
    main()

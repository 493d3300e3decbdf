"""Step time of FSDP2 training with the hook saving reductions every step vs without it.

Run::

    .venv/bin/python benchmarks/bench_fsdp.py                       # 2 gloo processes on CPU
    .venv/bin/python benchmarks/bench_fsdp.py --layers 2 8 32 --width 256 --steps 60
    .venv/bin/python benchmarks/bench_fsdp.py --updates    # Adam; updates and optimizer state too

Each of the 2 processes (gloo, CPU, torch at 1 intra-op thread) builds two identical FSDP2
models (``fully_shard`` per Linear layer and at the root): one trained without a hook, one
registered with a hook that saves min, max, mean, std and l2 of every weight, bias and
gradient at every step (``include_workers="one"``: the chief writes). The two are trained in
the same processes, interleaved in blocks of ``--block`` steps (on a shared machine whose
speed drifts, neighbouring blocks run at the same speed; which model goes first alternates,
and the first ``--settle`` steps of each block are left out: they still share the machine
with the other model's background work, the hook's worker and writer), after a warm-up. The table gives
the MEDIAN per-step time of each and their ratio, per model size (``--layers`` Linear layers
of ``--width``: 2 parameters per layer), and the statistics collectives per saved step (one
all_gather, whatever the number of parameters). ``--updates``: both models train with Adam and
the hook also saves the ``updates`` and ``optimizer_variables`` collections (``update/<w>``,
``exp_avg``, ``exp_avg_sq``, ``step``), in the same collective. Figures are rank 0's. The ranks run with
glibc's malloc set as ``bench_scaling.py``'s rows (``MALLOC_ENV``: every allocation from a
heap that is never trimmed), unless the environment sets those variables.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard


def make_model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def step(model, optimizer, x):
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def measure(rank: int, layers: int, width: int, steps: int, block: int, out_dir: str, settle: int = 2,
            updates: bool = False) -> dict:
    import smdebug.pytorch as smd

    plain, hooked = make_model(layers, width), make_model(layers, width)
    optimizer_class = torch.optim.Adam if updates else torch.optim.SGD
    opt_plain = optimizer_class(plain.parameters(), lr=1e-3)
    opt_hooked = optimizer_class(hooked.parameters(), lr=1e-3)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean", "std"], norms=["l2"]),
                    include_collections=["weights", "biases", "gradients"] + (
                        ["updates", "optimizer_variables"] if updates else []))
    hook.register_module(hooked)
    x = torch.randn(32, width, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):  # warm-up
        step(plain, opt_plain, x)
        step(hooked, opt_hooked, x)
    times = {"plain": [], "hooked": []}
    collectives_before, saved_steps = hook._sharded.groups.collectives, 0
    pair = [("plain", plain, opt_plain), ("hooked", hooked, opt_hooked)]
    for round_ in range(max(1, steps // block)):
        for name, model, optimizer in (pair if round_ % 2 == 0 else pair[::-1]):  # who goes first alternates
            for j in range(block):
                start = time.perf_counter()
                step(model, optimizer, x)
                if j >= settle:  # the first steps of a block share the machine with the other's background work
                    times[name].append(time.perf_counter() - start)
                saved_steps += name == "hooked"
    collectives = (hook._sharded.groups.collectives - collectives_before) / max(1, saved_steps)
    hook.close()
    plain_ms, hooked_ms = statistics.median(times["plain"]) * 1e3, statistics.median(times["hooked"]) * 1e3
    return {"layers": layers, "width": width, "parameters": 2 * layers, "plain_ms": plain_ms,
            "hooked_ms": hooked_ms, "ratio": hooked_ms / plain_ms, "collectives_per_saved_step": collectives,
            "steps_each": len(times["plain"])}


def worker(rank: int, port: int, args, result_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    rows = []
    base = tempfile.mkdtemp(prefix="bench_fsdp_") if rank == 0 else None
    holder = [base]
    dist.broadcast_object_list(holder)
    for layers in args.layers:
        out_dir = os.path.join(holder[0], f"layers_{layers}")
        rows.append(measure(rank, layers, args.width, args.steps, args.block, out_dir, args.settle, args.updates))
        dist.barrier()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(rows, f)
        shutil.rmtree(base, ignore_errors=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each model")
    parser.add_argument("--block", type=int, default=8, help="steps of one model before switching")
    parser.add_argument("--settle", type=int, default=2, help="steps left out at the start of each block")
    parser.add_argument("--updates", action="store_true",
                        help="Adam, and the hook saves updates and optimizer state too")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    # The ranks' glibc malloc as bench_scaling's rows: every allocation from a heap never
    # trimmed, so that neither model's gradients are faulted in again every step.
    from bench_scaling import MALLOC_ENV

    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)
    mp.spawn(worker, args=(port, args, result), nprocs=2)
    with open(result) as f:
        rows = json.load(f)
    os.unlink(result)
    saved = "weights, gradients, updates, Adam's state" if args.updates else "weights, gradients (SGD)"
    print(f"FSDP2 ({saved}), 2 gloo processes on CPU, torch threads 1, width {args.width}, median of "
          f"{rows[0]['steps_each']} "
          f"steps each, interleaved in blocks of {args.block} (first {args.settle} left out)")
    print(f"{'layers':>6} {'params':>6} {'no hook ms':>10} {'hook ms':>8} {'ratio':>6} {'added ms':>8} "
          f"{'collectives/step':>16}")
    for r in rows:
        print(f"{r['layers']:>6} {r['parameters']:>6} {r['plain_ms']:>10.2f} {r['hooked_ms']:>8.2f} "
              f"{r['ratio']:>6.2f} {r['hooked_ms'] - r['plain_ms']:>8.2f} {r['collectives_per_saved_step']:>16.1f}")


if __name__ == "__main__":
    sys.exit(main())

"""The overhead budget's fixed costs taken apart (PyTorch, CPU): a hook with a budget, the
same hook without its per-step non-finite check, and without the check nor the loss saved
every step, trained in one process with a baseline and a second unhooked model (the
control: the noise of the method).

    python benchmarks/bench_budget_parts.py                       # count 402, reductions@0.05
    python benchmarks/bench_budget_parts.py --scenario "size 256k" --blocks 30

Each model trains in turn for a block of 16 steps (the first 2 left out), the order rotating;
the figures are the median wall time and training-thread CPU (``time.thread_time``) of a step,
against the baseline's, and the cost the budget measured for itself at its last decisions.
The variants switch parts off from the outside (the check replaced by a no-op, the losses'
interval set beyond the run): a measurement, not a configuration to use.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_scaling  # the scenarios and hook configurations, one definition

import smdebug.pytorch as smd

MODELS = {"count 402": ("count", bench_scaling.count_model, 402, 64),
          "size 256k": ("size", bench_scaling.size_model, 512, 512)}
VARIANTS = ("baseline", "control", "hook", "hook, no check", "hook, no check, no loss")
BLOCK, SETTLE, WARMUP = 16, 2, 120


def _hook(axis: str, config: str, variant: str, work_dir: str):
    hook = bench_scaling.make_hook(smd, tempfile.mkdtemp(dir=work_dir), axis, config)
    if "no check" in variant:
        hook._driver.budget.check.check = lambda identity: None
    if "no loss" in variant:
        hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=10 ** 9)
    return hook


def measure(scenario: str, config: str, blocks: int) -> list:
    axis, factory, arg, width = MODELS[scenario]
    torch.manual_seed(0)
    models = [factory(arg) for _ in VARIANTS]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    loss_fns = [torch.nn.MSELoss() for _ in VARIANTS]
    optimizers = [torch.optim.SGD(model.parameters(), lr=1e-3) for model in models]
    x, y = torch.randn(bench_scaling.BATCH, width), torch.randn(bench_scaling.BATCH, width)
    work_dir = tempfile.mkdtemp(prefix="bench_budget_parts_")
    hooks = {}
    for i, variant in enumerate(VARIANTS):
        if variant.startswith("hook"):
            hooks[i] = _hook(axis, config, variant, work_dir)
            hooks[i].register_module(models[i])
            hooks[i].register_loss(loss_fns[i])

    def step(i):
        optimizers[i].zero_grad()
        loss_fns[i](models[i](x), y).backward()
        optimizers[i].step()

    for _ in range(WARMUP):  # the budget's first decisions settle
        for i in range(len(VARIANTS)):
            step(i)
    wall = [[] for _ in VARIANTS]
    cpu = [[] for _ in VARIANTS]
    for b in range(blocks):
        for k in range(len(VARIANTS)):
            i = (b + k) % len(VARIANTS)
            for j in range(BLOCK):
                start, start_cpu = time.perf_counter(), time.thread_time()
                step(i)
                if j >= SETTLE:
                    wall[i].append(time.perf_counter() - start)
                    cpu[i].append(time.thread_time() - start_cpu)
    rows = []
    for i, variant in enumerate(VARIANTS):
        measured = factor = None
        if i in hooks:
            budget = hooks[i].session.budget
            last = [d.measured for d in budget.history[-3:] if d.measured >= 0]
            measured, factor = (statistics.median(last) if last else None), budget.factor
            hooks[i].close()
        rows.append((variant, 1e3 * statistics.median(wall[i]), 1e3 * statistics.median(cpu[i]), factor, measured))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="count 402", choices=list(MODELS))
    parser.add_argument("--config", default="reductions@0.05", help="a bench_scaling.py configuration with a budget")
    parser.add_argument("--blocks", type=int, default=24, help="blocks of 16 steps of each model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.scenario, args.config, args.blocks)
    base_wall, base_cpu = rows[0][1], rows[0][2]
    print(f"{args.scenario}, {args.config}, {args.blocks * (BLOCK - SETTLE)} steps of each model, 1 intra-op thread")
    print("variant                   wall ms  ratio   cpu ms  ratio  factor  measured by the hook")
    for variant, wall_ms, cpu_ms, factor, measured in rows:
        extra = f"{factor:6d}  {100 * measured:.1f}%" if measured is not None else ""
        print(f"{variant:24s} {wall_ms:8.3f} {wall_ms / base_wall:6.3f} {cpu_ms:8.3f} {cpu_ms / base_cpu:6.3f}  {extra}")


if __name__ == "__main__":
    main()

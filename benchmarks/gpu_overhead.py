"""The hook's overhead on one device (CUDA when there is one), with host syncs counted, for
``benchmarks/gpu_check.sh``.

Run::

    python benchmarks/gpu_overhead.py                     # cuda:0 if available, else the CPU
    python benchmarks/gpu_overhead.py --steps 12 --smoke  # what CI runs on the CPU

Rows: the S2-like MLP (``size 256k``: 6 layers 512 wide, 24 saved tensors), ~400 small
tensors (``count 402``), the health reductions on the MLP, each with reductions every step,
then with ``overhead_budget`` 0.02 and 0.05, and ``control`` (no hook: the method's noise).
Models, configurations and the interleaved method are ``bench_scaling.py``'s: baseline and
hooked model in one process, alternating blocks, median of per-step times (each step ends
with ``torch.cuda.synchronize()`` so that it is timed whole).

Host syncs: while the hooked model trains, ``torch.cuda.set_sync_debug_mode("warn")`` makes
every synchronizing call (``.item()``, ``.cpu()``, ``nonzero`` ...) warn; the warnings are
counted, per saved step. The check expects at most one: the saved step's one transfer.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_scaling as scaling  # the models and hook configurations

ROWS = (("size 256k", "reductions"), ("count 402", "reductions"), ("size 256k", "health"), ("size 256k", "control"))


def _steps(model, optimizer, loss_fn, data, n, device, times=None, hook=None):
    """``n`` training steps; returns how many of them the hook saved (it decides at each forward)."""
    saved = 0
    for i in range(n):
        x, y = data[i % len(data)]
        start = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if times is not None:
            times.append(time.perf_counter() - start)
        saved += bool(hook is not None and hook.session.saving_step)
    return saved


def run_row(smd, scenario, config, steps, device, work_dir):
    label, axis, (factory, arg), width, *_ = scenario
    torch.manual_seed(0)
    models = [factory(arg).to(device), factory(arg).to(device)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for m in models]
    loss_fns = [torch.nn.MSELoss(), torch.nn.MSELoss()]
    data = [(torch.randn(scaling.BATCH, width, device=device), torch.randn(scaling.BATCH, width, device=device))
            for _ in range(4)]
    hook = scaling.make_hook(smd, os.path.join(work_dir, f"{label}_{config}".replace(" ", "_")), axis, config)
    if hook is not None:
        hook.register_module(models[1])
        hook.register_loss(loss_fns[1])
    budget = scaling.split_config(config)[1]
    warm = scaling.BUDGET_WARMUP if budget is not None else 4
    for which in (0, 1):
        _steps(models[which], optimizers[which], loss_fns[which], data, warm, device)
    times, syncs, saved_steps = ([], []), 0, 0
    for block in range(max(1, steps // scaling.BLOCK)):
        for which in ((0, 1) if block % 2 == 0 else (1, 0)):
            counting = which == 1 and device.type == "cuda"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if counting:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    saved_steps += _steps(models[which], optimizers[which], loss_fns[which], data, scaling.BLOCK,
                                          device, times[which], hook if which == 1 else None)
                finally:
                    if counting:
                        torch.cuda.set_sync_debug_mode(0)
            syncs += sum("synchroniz" in str(w.message) for w in caught) if counting else 0
    if hook is not None:
        chosen = scaling.budget_chosen(hook)
        hook.close()
    else:
        chosen = {}
    base, hooked = statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3
    return dict(scenario=label, config=config, base_ms=base, hooked_ms=hooked, ratio=hooked / base,
                syncs=syncs if device.type == "cuda" else None, saved_steps=saved_steps, **chosen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=96, help="timed steps of each model per row")
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.02, 0.05])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs, not its figures")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.smoke:
        scaling.BUDGET_WARMUP, scaling.BLOCK = 21, 4  # one decision, then a few steps
    import smdebug.pytorch as smd

    scenarios = {s[0]: s for s in scaling.scenario_list(["count", "size"], ["reductions"])}
    rows = [(label, config) for label, config in ROWS]
    rows += [(label, f"{config}@{b}") for b in args.budgets for label, config in ROWS if config != "control"]
    print(f"torch {torch.__version__}, device {device}, batch {scaling.BATCH}, median of per-step times, "
          f"baseline and hooked interleaved in blocks of {scaling.BLOCK}")
    print(f"{'scenario':<11}{'config':<17}{'base ms':>9}{'hooked ms':>10}{'ratio':>7}{'saved':>7}{'syncs':>7}"
          f"{'per saved':>10}  budget")
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work_dir:
        for label, config in rows:
            scenario = scenarios[label]
            if args.smoke:  # a narrow MLP, a short stack: the code paths, not the figures
                scenario = (label, scenario[1], (scenario[2][0], 64 if scenario[1] == "size" else 25), 64,
                            *scenario[4:])
            r = run_row(smd, scenario, config, args.steps, device, work_dir)
            chosen = (f"every {r['factor']}x, measured {100 * r['measured']:.1f}%"
                      if r.get("factor") is not None and r.get("measured") is not None else "")
            syncs = "-" if r["syncs"] is None else str(r["syncs"])
            per_saved = "-" if r["syncs"] is None or not r["saved_steps"] else f"{r['syncs'] / r['saved_steps']:.2f}"
            print(f"{label:<11}{config:<17}{r['base_ms']:>9.2f}{r['hooked_ms']:>10.2f}{r['ratio']:>7.2f}"
                  f"{r['saved_steps']:>7}{syncs:>7}{per_saved:>10}  {chosen}", flush=True)
            if r["syncs"] is not None and r["saved_steps"] and r["syncs"] > r["saved_steps"]:
                failures.append(f"{label} {config}: {r['syncs']} host syncs in {r['saved_steps']} saved steps")

    if failures:
        sys.exit("more than one host sync per saved step:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()

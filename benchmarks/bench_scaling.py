"""How the PyTorch hook's cost grows with the number of saved tensors and their size.

Run (torch at one intra-op thread, as the figures in docs/performance.md)::

    .venv/bin/python benchmarks/bench_scaling.py
    .venv/bin/python benchmarks/bench_scaling.py --axis count --configs reductions
    # the same scenarios through smdebug 1.0.34, in its own environment, merged into the table:
    .venv/bin/python benchmarks/bench_scaling.py --original-python "$(bash benchmarks/original_env.sh | tail -1)"
    # (the original's steps take up to 100x longer: it runs --original-steps, 40 by default)

Two axes, each with three hook configurations:

* ``count``: 25, 100, 400 saved tensors. A stack of small blocks (``Linear(64, 64)`` and
  ``ReLU``): each block's weight, bias, their gradients and both modules' outputs, six
  tensors of at most 4,096 elements.
* ``size``: a 6-layer MLP ``width`` wide (weights of 4k, 65k, 262k, 1M elements): its 24
  weights, biases and gradients.
* configurations: ``reductions`` (min, max, mean, std, l2 of every tensor, every step),
  ``full`` (whole tensors, every step), ``default`` (the hook's defaults: losses every
  500 steps), ``flight`` (the flight recorder, docs/flight_recorder.md: the same
  reductions of weights, biases and gradients kept in memory every step for the last 16
  steps, saved every 500 steps, with its per-module NaN/Inf notes; nothing fires),
  ``flight-noloc`` (the same with ``locate=False``: no per-module notes), ``health-red``
  (``reductions`` plus every health reduction: nonfinite, zero_fraction, kurtosis and the
  eight overflow_/underflow_ ones), ``health`` (``health-red`` plus the ``updates`` and
  ``optimizer_variables`` collections with the same reductions; both models train with SGD
  momentum 0.9 in this row, so that there is optimizer state) and ``control`` (no hook on either model: the noise floor of the method; a
  ratio away from 1.00 there is the machine, not the hook).
* ``--budgets 0.02 0.05``: each hooked configuration also runs as ``<config>@<budget>``, with
  the hook's ``overhead_budget`` (smdebug_core/capture/budget.py); ``--budget-warmup`` steps
  (100) are left out first, so that its decisions (every 20 steps) have settled, and the row
  says the interval factor it chose for the expensive collections and the cost it measured::

      python benchmarks/bench_scaling.py --axis count size --scenarios "count 402" "size 256k" \
          --configs reductions health control --budgets 0.02 0.05 --steps 200

Method, as a user feels it: the baseline model and the hooked model (same architecture,
same data) are trained in one process, in alternating blocks of ``--block`` steps (16),
which one goes first alternating, so both see the machine at the same speed. The first
``--settle`` steps (2) of each block are left out: they still share the machine with the
other model's background work (after a hooked block, the hook's worker and writer finish
its last steps). Alternating every step would put the hook's background work inside the
baseline's steps and flatter the hook (docs/performance.md). Each step is timed on its own
(a whole iteration: zero_grad, forward, backward, optimizer step; the hook's end of step
happens inside the next one). The
figures are the **median of per-step times** of each, their ratio, the added time per
step and the added time per saved tensor. The hook's ``close()`` (the writer finishing
the run's files) is timed apart. Batches of 64 rows (``--batch``); full-tensor runs are shortened so a
run writes at most ``--max-mb`` megabytes. ``--rounds N`` runs every scenario N times in
turn and reports the median of each figure with every round's ratio: on a shared machine
the hour moves a ratio more than most changes do, and the spread shows by how much.

Each row runs in a fresh process (``--one-process`` runs them all in this one), with glibc's
malloc told to serve every allocation from a heap it never trims (:data:`MALLOC_ENV`, unless
the environment sets those variables). Both guard the baseline against the allocator's
history: with the defaults, the gradients of whichever model sits at the top of the heap
are given back to the system at each ``zero_grad()`` and faulted in again at the next
backward, and two identical models without a hook read 1.11-1.31x at 1M elements (the
``control`` rows); in one process, what earlier rows allocated decides which model that is.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

COUNTS = (25, 100, 400)
SIZES = {4096: 64, 65536: 256, 262144: 512, 1048576: 1024}  # elements of a weight -> MLP width
CONFIGS = ("reductions", "health-red", "health", "full", "default", "flight", "flight-noloc", "control")
BATCH = 64
BLOCK = 16  # steps of one model before switching to the other
SETTLE = 2  # steps at the start of each block left out of the figures
BUDGET_WARMUP = 100  # untimed steps of a row with an overhead budget: its first decisions settle


def count_model(tensors: int) -> torch.nn.Module:
    blocks = max(1, round(tensors / 6))
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def size_model(width: int) -> torch.nn.Module:
    layers = []
    for i in range(6):
        layers.append(torch.nn.Linear(width, width))
        if i < 5:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def scenario_list(axes, configs):
    """(label, axis, model factory, input width, saved tensors per step, bytes per step, config)."""
    out = []
    for axis in axes:
        if axis == "count":
            for n in COUNTS:
                blocks = max(1, round(n / 6))
                saved = 6 * blocks
                nbytes = 4 * blocks * (2 * (64 * 64 + 64) + 2 * BATCH * 64)
                for config in configs:
                    out.append((f"count {saved}", axis, (count_model, n), 64, saved, nbytes, config))
        else:
            for numel, width in SIZES.items():
                saved = 24
                nbytes = 4 * 6 * 2 * (width * width + width)
                for config in configs:
                    out.append((f"size {numel // 1024}k", axis, (size_model, width), width, saved, nbytes, config))
    return out


def split_config(config: str):
    """``"reductions@0.02"`` -> ``("reductions", 0.02)``; a plain configuration has no budget."""
    base, _, budget = config.partition("@")
    return base, float(budget) if budget else None


def make_hook(smd, out_dir, axis, config):
    config, budget = split_config(config)
    return _make_hook(smd, out_dir, axis, config, {} if budget is None else {"overhead_budget": budget})


def _make_hook(smd, out_dir, axis, config, extra):
    if config == "control":
        return None  # no hook on either model: the measurement's own noise floor
    if config == "default":
        return smd.Hook(out_dir=out_dir, **extra)
    if config in ("flight", "flight-noloc"):
        return smd.Hook(out_dir=out_dir, reduction_config=REDUCTIONS(smd), **extra,
                        flight_recorder=smd.FlightRecorder(steps=16, collections=["weights", "biases", "gradients"],
                                                           locate=config == "flight"))
    kwargs = dict(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                  include_collections=["weights", "biases", "gradients"], **extra)
    if axis == "count":
        kwargs["include_regex"] = [r"^\d+_output_0$"]
    if config == "reductions":
        kwargs["reduction_config"] = REDUCTIONS(smd)
    if config.startswith("health"):
        kwargs["reduction_config"] = smd.ReductionConfig(reductions=["min", "max", "mean", "std"] + HEALTH,
                                                         norms=["l2"])
        if config == "health":
            kwargs["include_collections"] += ["updates", "optimizer_variables"]
    return smd.Hook(**kwargs)


def REDUCTIONS(smd):  # the reductions of the "reductions" and "flight" configurations
    return smd.ReductionConfig(reductions=["min", "max", "mean", "std"], norms=["l2"])


#: The health reductions (smdebug.reductions.HEALTH_REDUCTIONS), spelled out: smdebug 1.0.34 has none.
HEALTH = ["nonfinite", "zero_fraction", "kurtosis"] + [f"{kind}_{t}" for kind in ("overflow", "underflow")
                                                      for t in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")]


def run(smd, scenario, steps, warmup, work_dir):
    """Per-step times (seconds) of the baseline and of the hooked model, and close() time."""
    label, axis, (factory, arg), width, saved, nbytes, config = scenario
    if split_config(config)[1] is not None:
        warmup = max(warmup, BUDGET_WARMUP)  # its decisions settle first
    torch.manual_seed(0)
    models = [factory(arg), factory(arg)]
    models[1].load_state_dict(models[0].state_dict())
    loss_fns = [torch.nn.MSELoss(), torch.nn.MSELoss()]  # the hook watches its own loss module only
    momentum = 0.9 if split_config(config)[0] == "health" else 0.0  # optimizer state to save
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3, momentum=momentum) for m in models]
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(BATCH, width, generator=gen), torch.randn(BATCH, width, generator=gen)) for _ in range(4)]
    out_dir = os.path.join(work_dir, f"{label.replace(' ', '_')}_{config.replace('@', '_')}")
    hook = make_hook(smd, out_dir, axis, config)
    if hook is not None:
        hook.register_module(models[1])
        hook.register_loss(loss_fns[1])
    times = ([], [])
    clock = time.perf_counter
    block, settle = BLOCK, SETTLE
    done = [0, 0]  # timed steps of each model
    for i in range(warmup):  # not timed: first calls, buffers, the hook's first steps
        for which in (0, 1):
            x, y = data[i % len(data)]
            optimizers[which].zero_grad()
            loss_fns[which](models[which](x), y).backward()
            optimizers[which].step()
    b = 0
    while min(done) < steps:
        for which in ((0, 1) if b % 2 == 0 else (1, 0)):  # which model goes first alternates
            model, optimizer = models[which], optimizers[which]
            for j in range(block):
                x, y = data[(done[which] + j) % len(data)]
                start = clock()
                optimizer.zero_grad()
                loss_fns[which](model(x), y).backward()
                optimizer.step()
                elapsed = clock() - start
                # The first steps after a switch still share the machine with the other
                # model's background work (the hook's worker and writer after a hooked block).
                if j >= settle and done[which] < steps:
                    times[which].append(elapsed)
                    done[which] += 1
        b += 1
    chosen = budget_chosen(hook)
    start = clock()
    if hook is not None:
        (getattr(hook, "close", None) or hook._cleanup)()
    close_s = clock() - start
    shutil.rmtree(out_dir, ignore_errors=True)
    return times, close_s, chosen


def budget_chosen(hook) -> dict:
    """The budget's interval factor at the end and the cost it measured at its last decisions."""
    budget = getattr(getattr(hook, "session", None), "budget", None)
    if budget is None or not budget.history:
        return {}
    measured = [d.measured for d in budget.history[-3:] if d.measured >= 0]
    return {"budget": budget.setting.fraction, "factor": budget.factor,
            "factors": [1 << d.level for d in budget.history],
            "measured": statistics.median(measured) if measured else None}


def measure(smd, scenarios, steps, warmup, max_mb, quiet=False):
    work_dir = tempfile.mkdtemp(prefix="bench_scaling_")
    results = []
    try:
        for scenario in scenarios:
            label, axis, _, _, saved, nbytes, config = scenario
            n = steps
            if config == "full":
                n = max(20, min(steps, int(max_mb * 2 ** 20 // max(nbytes, 1))))
            (base, hooked), close_s, chosen = run(smd, scenario, n, warmup, work_dir)
            base_ms, hooked_ms = 1e3 * statistics.median(base), 1e3 * statistics.median(hooked)
            added_us = 1e3 * (hooked_ms - base_ms)
            per_tensor = split_config(config)[0] in ("reductions", "full", "flight", "flight-noloc", "health-red")
            if config.startswith("flight") and axis == "count":
                saved = saved * 4 // 6  # weights, biases and their gradients; no module outputs
            row = dict(scenario=label, axis=axis, config=config, steps=n, saved=saved if per_tensor else 0,
                       base_ms=base_ms, hooked_ms=hooked_ms, ratio=hooked_ms / base_ms, added_us=added_us,
                       us_per_tensor=added_us / saved if per_tensor else None, close_ms=1e3 * close_s, **chosen)
            results.append(row)
            if not quiet:
                print_row(row, "", file=sys.stderr)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return results


def _config(text: str) -> str:
    base, budget = text.partition("@")[0], text.partition("@")[2]
    if base not in CONFIGS or (budget and not 0 < float(budget) < 1):
        raise argparse.ArgumentTypeError(f"a configuration is one of {', '.join(CONFIGS)}, optionally @<budget "
                                         f"in (0, 1)>, got {text!r}")
    return text


def _common_args(args) -> list:
    """The measurement's options, for a child run of this script."""
    return ["--budget-warmup", str(args.budget_warmup), "--warmup", str(args.warmup), "--threads", str(args.threads), "--max-mb", str(args.max_mb),
            "--batch", str(args.batch), "--block", str(args.block), "--settle", str(args.settle)]


#: glibc malloc settings of the child runs (unless set already): every allocation from the
#: heap, which is never trimmed. With glibc's defaults, whichever model's gradients sit at the
#: top of the heap have their pages returned to the system when zero_grad() frees them and
#: faulted in again by the next backward: six 4 MB gradients cost that model 6-9 ms a step,
#: and two identical models without a hook read 1.11-1.31x at 1M elements.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 28), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def _child_env() -> dict:
    env = dict(os.environ)
    for key, value in MALLOC_ENV.items():
        env.setdefault(key, value)
    return env


def _measure_in_child(scenario, args) -> list:
    """One row measured by a fresh run of this script (a fresh interpreter and heap)."""
    label, axis, *_, config = scenario
    cmd = [sys.executable, os.path.abspath(__file__), "--quiet", "--one-process", "--json", "/dev/stdout",
           "--axis", axis, "--configs", config, "--scenarios", label, "--steps", str(args.steps), *_common_args(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
    if proc.returncode:
        sys.exit(f"the run of {label} / {config} failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for row in rows:
        if not args.quiet:
            print_row(row, "", file=sys.stderr)
    return rows


def combine_rounds(rounds):
    """One row per scenario and configuration from several rounds of :func:`measure`: the
    median of each figure over the rounds (the ratio: the median of the rounds' ratios), and
    every round's ratio in ``ratios``. On a shared machine the hour moves a ratio more than
    most code changes do (docs/performance.md); the spread says how much."""
    if len(rounds) == 1:
        return rounds[0]
    combined = []
    for same in zip(*rounds):
        row = dict(same[0])
        for key in ("base_ms", "hooked_ms", "ratio", "added_us", "us_per_tensor", "close_ms"):
            values = [r[key] for r in same if r[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["ratios"] = [r["ratio"] for r in same]
        combined.append(row)
    return combined


HEADER = (f"{'scenario':<11}{'config':<17}{'library':<10}{'steps':>6}{'base ms':>9}{'hooked ms':>10}{'ratio':>7}"
          f"{'added us':>10}{'us/tensor':>10}{'close ms':>9}")


def print_row(r, library, file=sys.stdout):
    per = f"{r['us_per_tensor']:.1f}" if r.get("us_per_tensor") is not None else "-"
    rounds = "  " + ", ".join(f"{x:.2f}" for x in r["ratios"]) if r.get("ratios") else ""
    if r.get("factor") is not None:
        measured = f"{100 * r['measured']:.1f}%" if r.get("measured") is not None else "-"
        rounds += f"  expensive every {r['factor']}x (decisions {r['factors']}), measured {measured}"
    print(f"{r['scenario']:<11}{r['config']:<17}{library:<10}{r['steps']:>6}{r['base_ms']:>9.2f}"
          f"{r['hooked_ms']:>10.2f}{r['ratio']:>7.2f}{r['added_us']:>10.0f}{per:>10}{r['close_ms']:>9.0f}{rounds}",
          file=file)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--axis", nargs="+", choices=("count", "size"), default=["count", "size"])
    parser.add_argument("--configs", nargs="+", type=_config, default=list(CONFIGS))
    parser.add_argument("--budgets", nargs="+", type=float, default=[],
                        help="also run each hooked configuration with these overhead budgets (e.g. 0.02 0.05)")
    parser.add_argument("--budget-warmup", type=int, default=100,
                        help="untimed steps of a budget's rows (its decisions settle), at most 200")
    parser.add_argument("--scenarios", nargs="+", metavar="LABEL",
                        help="only these rows, e.g. 'count 402' 'size 256k' (default: all of the axes)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each model per scenario")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help=f"rows per batch (default {BATCH}): a longer step for the same saved tensors")
    parser.add_argument("--block", type=int, default=BLOCK,
                        help=f"steps of one model before switching to the other (default {BLOCK}); 1 alternates "
                             "every step, which lets the hook's background threads run inside the baseline's steps")
    parser.add_argument("--settle", type=int, default=SETTLE,
                        help=f"steps left out at the start of each block (default {SETTLE})")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every scenario this many times, in turn, and report the median of each "
                             "figure with every round's ratio (default 1)")
    parser.add_argument("--max-mb", type=float, default=1500, help="bytes a full-tensor run may write")
    parser.add_argument("--original-python", help="also run the scenarios through smdebug 1.0.34 with this "
                                                  "interpreter (benchmarks/original_env.sh)")
    parser.add_argument("--original-steps", type=int, default=40,
                        help="timed steps per scenario for smdebug 1.0.34 (its steps are up to 100x longer)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--one-process", action="store_true",
                        help="run every row in this process, one after the other, instead of each row in a "
                             "fresh process (what earlier rows allocated then biases later ones: see the docstring)")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    globals()["BATCH"] = args.batch  # read by run() and the scenarios' sizes
    globals()["BLOCK"], globals()["SETTLE"] = args.block, args.settle
    globals()["BUDGET_WARMUP"] = args.budget_warmup
    args.configs += [f"{c}@{b}" for b in args.budgets for c in list(args.configs)
                     if c not in ("control", "default") and "@" not in c]

    import smdebug
    import smdebug.pytorch as smd

    scenarios = [s for s in scenario_list(args.axis, args.configs) if not args.scenarios or s[0] in args.scenarios]
    library = "original" if getattr(smdebug, "__version__", "") == "1.0.34" else "ours"
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.one_process:
        rounds = [measure(smd, scenarios, args.steps, args.warmup, args.max_mb, args.quiet)
                  for _ in range(args.rounds)]
    else:
        rounds = [[row for scenario in scenarios for row in _measure_in_child(scenario, args)]
                  for _ in range(args.rounds)]
    rows = [dict(r, library=library) for r in combine_rounds(rounds)]
    # control has no hook to compare; smdebug 1.0.34 has no flight recorder
    hooked_configs = [c for c in args.configs if c not in ("control", "flight", "flight-noloc", "health-red", "health")
                      and "@" not in c]
    if args.original_python and hooked_configs:
        cmd = [args.original_python, os.path.abspath(__file__), "--quiet", "--one-process", "--json", "/dev/stdout",
               "--axis", *args.axis, "--configs", *hooked_configs, "--steps", str(args.original_steps),
               *_common_args(args)]
        if args.scenarios:
            cmd += ["--scenarios", *args.scenarios]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
        if proc.returncode:
            sys.exit(f"the original's run failed:\n{proc.stderr[-3000:]}")
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(json.dumps(rows) + "\n")
        if args.json == "/dev/stdout":
            return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), batch {BATCH}, "
          f"median of per-step times, baseline and hooked interleaved in blocks of {BLOCK} steps "
          f"(the first {SETTLE} of each block left out)"
          + (f"; {args.rounds} rounds: medians over the rounds, then every round's ratio" if args.rounds > 1 else ""))
    print(HEADER + ("  ratio of each round" if args.rounds > 1 else ""))
    order = {(s[0], s[6]): i for i, s in enumerate(scenarios)}
    for r in sorted(rows, key=lambda r: (order.get((r["scenario"], r["config"]), 0), r["library"] != "ours")):
        print_row(r, r["library"])


if __name__ == "__main__":
    main()

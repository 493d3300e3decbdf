"""Where a hooked training step's CPU goes, thread by thread (PyTorch).

``bench_scaling.py`` says how much longer a step takes with the hook; this says who pays
for it. A model of ``bench_scaling.py`` (same scenarios, same hook configurations) is
trained alone in this process, first without a hook, then with one (each in a fresh child
process), and every thread's CPU time over the timed steps is read from
``/proc/self/task/<tid>/stat`` and divided by the steps: the training thread, the hook's
step worker (``smdebug-steps``: reductions, host copies) and its writer (``smdebug-writer``:
records and files).

Why it matters on a small machine: every thread of the hook runs Python under one GIL,
and on two cores the training thread has one core and the hook's threads share the other.
A step can then be no shorter than the training thread's own CPU time, whatever the
background threads do; so the training thread's added CPU bounds the ratio from below.

    .tox/pytorch/bin/python benchmarks/bench_thread_cpu.py                     # count 402, reductions
    .tox/pytorch/bin/python benchmarks/bench_thread_cpu.py --scenario "size 256k" --steps 300
    taskset -c 0 .tox/pytorch/bin/python benchmarks/bench_thread_cpu.py         # every thread on one core

Linux only (``/proc``). torch at one intra-op thread, batch 64, glibc malloc as in
``bench_scaling.py`` (``MALLOC_ENV``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_scaling  # the scenarios and hook configurations, one definition


def thread_cpu_seconds() -> dict:
    """CPU seconds (user + system) of each live thread of this process, by Python thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), f"thread {tid}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(label: str, config: str, steps: int, warmup: int) -> dict:
    """Wall and per-thread CPU milliseconds per step of one model trained alone."""
    import torch

    import smdebug.pytorch as smd

    scenario = next(s for s in bench_scaling.scenario_list(("count", "size"), (config,)) if s[0] == label)
    _, axis, (factory, arg), width, *_ = scenario
    torch.manual_seed(0)
    model = factory(arg)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(bench_scaling.BATCH, width, generator=gen),
             torch.randn(bench_scaling.BATCH, width, generator=gen)) for _ in range(4)]
    with tempfile.TemporaryDirectory(prefix="bench_thread_cpu_") as work:
        hook = bench_scaling.make_hook(smd, os.path.join(work, "run"), axis, config)
        if hook is not None:
            hook.register_module(model)
            hook.register_loss(loss_fn)

        def step(i):
            x, y = data[i % len(data)]
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

        for i in range(warmup):
            step(i)
        before, start = thread_cpu_seconds(), time.perf_counter()
        for i in range(steps):
            step(i)
        wall, after = time.perf_counter() - start, thread_cpu_seconds()
        if hook is not None:
            hook.close()
    cpu = {name: 1e3 * (after[name] - before.get(name, 0.0)) / steps for name in after}
    return {"wall_ms": 1e3 * wall / steps, "cpu_ms": {k: v for k, v in cpu.items() if v > 0.0005}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="count 402", help="a bench_scaling.py scenario (count 24, size 256k...)")
    parser.add_argument("--config", default="reductions", choices=[c for c in bench_scaling.CONFIGS if c != "control"])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--child", choices=("baseline", "hooked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(1)
        config = "control" if args.child == "baseline" else args.config
        print(json.dumps(measure(args.scenario, config, args.steps, args.warmup)))
        return
    env = dict(os.environ)
    for key, value in bench_scaling.MALLOC_ENV.items():
        env.setdefault(key, value)
    results = {}
    for which in ("baseline", "hooked"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", which, "--scenario", args.scenario,
               "--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.exit(f"the {which} run failed:\n{proc.stderr[-3000:]}")
        results[which] = json.loads(proc.stdout.strip().splitlines()[-1])
    base, hooked = results["baseline"], results["hooked"]
    train_base = base["cpu_ms"].get("MainThread", 0.0)
    print(f"{args.scenario}, {args.config}, {args.steps} steps, each model alone (ms per step)")
    print(f"  wall                 {base['wall_ms']:7.3f} -> {hooked['wall_ms']:7.3f}  "
          f"({hooked['wall_ms'] / base['wall_ms']:.2f}x)")
    for name, ms in sorted(hooked["cpu_ms"].items(), key=lambda kv: kv[0] != "MainThread"):
        label = "training thread" if name == "MainThread" else name
        was = f"{train_base:7.3f} -> " if name == "MainThread" else " " * 11
        print(f"  {label:20s} {was}{ms:7.3f} CPU")
    floor = hooked["cpu_ms"].get("MainThread", 0.0) / base["wall_ms"]
    print(f"  the training thread's CPU alone bounds the ratio at {floor:.2f}x")


if __name__ == "__main__":
    main()

"""What a run costs to store and to open, in each layout (docs/format.md 10; docs/performance.md).

Run::

    .venv/bin/python benchmarks/bench_store.py                       # 10,000 x 200 x 5 in the store, 500 x 200 x 5 in both
    .venv/bin/python benchmarks/bench_store.py --steps 500 --layouts store smdebug-1.0.34

A run of ``--steps`` saved steps, each with ``--tensors`` tensors of ``--reductions``
reductions (one ScalarRun a step, as the hook hands a batch of reductions) and a loss, is
written through ``RunWriter`` (the writer the hook uses, without a framework) and then read:

* ``bytes/value``: the run's bytes on disk over the values saved;
* ``files/1k steps``: files per 1,000 saved steps of the one worker;
* ``writer us/value``: the writer thread's CPU (the process's CPU less the submitting
  thread's) per value saved;
* ``open s``: ``create_trial`` and ``steps()``; ``table s``: ``to_dataframe()`` after it;
* ``report s`` / ``rules s`` (``--report``): ``smdebug report`` and the default rules on the run.

Each figure is the median of ``--repeats`` runs (3), the layouts alternating.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from smdebug.modes import ModeKeys
from smdebug.storage.step_data import ScalarRun, StepData
from smdebug.storage.writer import RunWriter

REDUCTIONS = ("min", "max", "mean", "std", "l2")


def write_run(out_dir: str, layout: str, steps: int, tensors: int, reductions: int) -> dict:
    tags = tuple(f"smdebug/reductions/{REDUCTIONS[r % len(REDUCTIONS)]}/layer{t}.weight"
            for t in range(tensors) for r in range(reductions))
    rng = np.random.default_rng(0)
    values = rng.standard_normal((64, len(tags)))
    writer = RunWriter(out_dir, "worker_0", run_layout=layout)
    writer.write_collections(b'{"collections": {"losses": {"name": "losses", "include_regex": ["loss"], '
                             b'"reduction_config": {}, "save_config": {}}}, "_meta": {"num_workers": 1}}')
    main_cpu0, cpu0 = time.thread_time(), time.process_time()
    for step in range(steps):
        writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=[
            ("loss", np.float32(1.0 / (step + 1))), ScalarRun(tags, values[step % 64] * (1 + step * 1e-6))]))
    writer.close()
    writer_cpu = (time.process_time() - cpu0) - (time.thread_time() - main_cpu0)
    files = nbytes = 0
    for d, _, fs in os.walk(out_dir):
        for f in fs:
            files += 1
            nbytes += os.path.getsize(os.path.join(d, f))
    n_values = steps * (len(tags) + 1)
    return {"bytes/value": nbytes / n_values, "files/1k steps": files * 1000 / steps,
            "writer us/value": writer_cpu * 1e6 / n_values, "MB": nbytes / 1e6}


def read_run(out_dir: str) -> dict:
    code = (
        "import sys, time; t0 = time.perf_counter()\n"
        "from smdebug.trials import create_trial\n"
        "t1 = time.perf_counter(); tr = create_trial(sys.argv[1], progress=False); tr.steps()\n"
        "t2 = time.perf_counter(); df = tr.to_dataframe(progress=False)\n"
        "t3 = time.perf_counter(); print(t2 - t1, t3 - t2, len(df))\n"
    )
    # A fresh process: what a user's first `create_trial` costs, nothing cached.
    out = subprocess.run([sys.executable, "-c", code, out_dir], capture_output=True, text=True, check=True)
    open_s, table_s, rows = out.stdout.split()
    return {"open s": float(open_s), "table s": float(table_s), "rows": int(rows)}


def time_command(args) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, capture_output=True, check=False)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[500, 10000])
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--reductions", type=int, default=5)
    p.add_argument("--layouts", nargs="+", default=["store", "smdebug-1.0.34"])
    p.add_argument("--max-1034-steps", type=int, default=500,
                   help="the 1.0.34 layout only up to this many steps (10,000 steps of it: 2.4 GB, 20,000 files)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--report", action="store_true", help="also time `smdebug report` and the default rules")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench_store_")
    print(f"{args.tensors} tensors x {args.reductions} reductions + a loss per step; median of {args.repeats}")
    header = ["layout", "steps", "MB", "bytes/value", "files/1k steps", "writer us/value", "open s", "table s"]
    if args.report:
        header += ["report s", "rules s"]
    print(" | ".join(header))
    try:
        for steps in args.steps:
            results = {layout: [] for layout in args.layouts
                       if layout == "store" or steps <= args.max_1034_steps}
            for _ in range(args.repeats):
                for layout in results:
                    run = os.path.join(root, f"{layout}_{steps}")
                    shutil.rmtree(run, ignore_errors=True)
                    figures = write_run(run, layout, steps, args.tensors, args.reductions)
                    figures.update(read_run(run))
                    if args.report:
                        figures["report s"] = time_command([sys.executable, "-m", "smdebug", "report", run,
                                                            "-o", os.path.join(root, "report.html")])
                        figures["rules s"] = time_command([sys.executable, "-m", "smdebug", "rules", run])
                    results[layout].append(figures)
            for layout, runs in results.items():
                row = [layout, str(steps)] + [f"{statistics.median(r[k] for r in runs):.3g}" for k in header[2:]]
                print(" | ".join(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()

"""Throughput of the background RunWriter against plain ``open().write()`` of the same bytes.

    .venv/bin/python benchmarks/bench_writer.py                      # 64 x 1 MiB float32 per step, 50 steps, 5 reps
    .venv/bin/python benchmarks/bench_writer.py --tensors 2000 --tensor-kib 1 --steps 20   # many small tensors
    .venv/bin/python benchmarks/bench_writer.py --reductions 402   # steps of reductions: pairs vs ScalarRun

``--reductions N``: steps of min/max/mean/std/l2 of N tensors (5N float64 records), handed
over as one ``(tag, numpy scalar)`` pair per value (how reductions travelled before
``ScalarRun``) and as one :class:`~smdebug.storage.step_data.ScalarRun` (how the hooks hand
them over now), in turn; the table gives the median time per step of each over ``--reps``
runs of ``--steps`` steps (submit, then close: the writer's whole work), on one core's worth
of Python.

Each repetition runs both methods back to back (alternating which goes first) in a fresh
directory under ``--dir``; the table reports medians. ``ratio`` = writer time / plain time
(1.0 means the writer costs nothing beyond the write itself). ``submit`` is the time the
training thread spent inside ``RunWriter.submit``. Files are deleted after each run.
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from smdebug.modes import ModeKeys
from smdebug.storage.writer import RunWriter, StepData
from smdebug.storage.step_data import ScalarRun


def make_tensors(count, elements):
    rng = np.random.default_rng(0)
    return [(f"layer{i}/weight", rng.standard_normal(elements, dtype=np.float32)) for i in range(count)]


def run_plain(directory, tensors, steps):
    """The floor: one file per step, every tensor's bytes written as-is."""
    started = time.perf_counter()
    for step in range(steps):
        with open(os.path.join(directory, f"{step:012d}.bin"), "wb") as handle:
            for _, array in tensors:
                handle.write(array.data)
    return time.perf_counter() - started, 0.0


def run_writer(directory, tensors, steps):
    started = time.perf_counter()
    in_submit = 0.0
    writer = RunWriter(directory, "worker_0")
    for step in range(steps):
        before = time.perf_counter()
        writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=tensors))
        in_submit += time.perf_counter() - before
    if not writer.close(timeout=600):
        raise RuntimeError(f"writer failed: {writer.failed!r}")
    return time.perf_counter() - started, in_submit


def run_reductions(directory, tags, steps, as_run):
    """Steps of reductions through a RunWriter: seconds for all (submits and close)."""
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(len(tags)) for _ in range(4)]
    started = time.perf_counter()
    writer = RunWriter(directory, "worker_0")
    for step in range(steps):
        step_values = values[step % 4]
        tensors = [ScalarRun(tags, step_values)] if as_run else list(zip(tags, step_values))
        writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=tensors), publish=True)
    if not writer.close(timeout=600):
        raise RuntimeError(f"writer failed: {writer.failed!r}")
    return time.perf_counter() - started


def bench_reductions(count, steps, reps, root):
    tags = tuple(f"smdebug/reductions/{op}/{i}_output_0" for i in range(count)
                 for op in ("min", "max", "mean", "std", "l2"))
    times = {"pairs": [], "ScalarRun": []}
    for rep in range(reps):
        order = [("pairs", False), ("ScalarRun", True)]
        if rep % 2:
            order.reverse()
        for name, as_run in order:
            directory = os.path.join(root, f"{name}_{rep}")
            times[name].append(run_reductions(directory, tags, steps, as_run))
            shutil.rmtree(directory)
    print(f"{len(tags)} reductions a step ({count} tensors) x {steps} steps, {reps} reps, medians")
    print(f"{'handed over as':<15} {'ms a step':>10}")
    for name, values in times.items():
        print(f"{name:<15} {1e3 * statistics.median(values) / steps:10.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=64, help="tensors per step (default 64)")
    parser.add_argument("--tensor-kib", type=int, default=1024, help="size of each float32 tensor in KiB (default 1024)")
    parser.add_argument("--steps", type=int, default=50, help="steps per run (default 50)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each method (default 5)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--reductions", type=int, default=0, metavar="N",
                        help="instead: steps of the reductions of N tensors, as pairs and as a ScalarRun")
    args = parser.parse_args(argv)

    if args.reductions:
        root = tempfile.mkdtemp(prefix="bench_writer_", dir=args.dir)
        try:
            bench_reductions(args.reductions, args.steps if args.steps != 50 else 500, args.reps, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return

    tensors = make_tensors(args.tensors, args.tensor_kib * 1024 // 4)
    total_bytes = sum(a.nbytes for _, a in tensors) * args.steps
    root = tempfile.mkdtemp(prefix="bench_writer_", dir=args.dir)
    times = {"plain write": [], "RunWriter": []}
    submits = []
    try:
        for rep in range(args.reps):
            order = [("plain write", run_plain), ("RunWriter", run_writer)]
            if rep % 2:
                order.reverse()
            for name, method in order:
                directory = os.path.join(root, f"{name.replace(' ', '_')}_{rep}")
                os.makedirs(directory)
                elapsed, in_submit = method(directory, tensors, args.steps)
                times[name].append(elapsed)
                if name == "RunWriter":
                    submits.append(in_submit)
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    plain = statistics.median(times["plain write"])
    print(f"{args.tensors} tensors x {args.tensor_kib} KiB x {args.steps} steps = {total_bytes / 2**30:.2f} GiB,"
          f" {args.reps} reps, medians")
    print(f"{'method':<12} {'seconds':>8} {'GiB/s':>7} {'ratio':>6} {'submit s':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        submit = f"{statistics.median(submits):9.3f}" if name == "RunWriter" else f"{'-':>9}"
        print(f"{name:<12} {median:8.3f} {total_bytes / 2**30 / median:7.2f} {median / plain:6.2f} {submit}")


if __name__ == "__main__":
    main()

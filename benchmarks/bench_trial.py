"""How fast the Trial opens a large run and reads one tensor over all its steps.

Writes a run of ``--steps`` steps (``--tensors`` small tensors each, one worker) once
into a directory, then, in fresh processes:

1. ``create_trial(path)`` followed by ``trial.steps()``;
2. ``trial.tensor(name).values()``: one tensor at every step;

and prints the seconds and the number of files opened. With ``--smdebug-python PATH``
(an interpreter that has the original ``smdebug`` installed), the same two operations
run with the original's Trial and the ratio is printed.

``--table`` measures instead how many values per second come out of a finished run of
``--steps`` steps x 25 scalar/reduction records (5 scalars, and 4 tensors saved as 5
reductions each): ``Trial.to_dataframe()`` (all 250,000 values, best of ``--repeat``
fresh processes, the trial already open) against a loop of one ``value()`` /
``reduction_value()`` call per value (over the first ``--sample-steps`` steps), and with
``--smdebug-python`` the same loop with the original's Trial (its only API).

    python benchmarks/bench_trial.py                      # 10,000 steps in a temp dir
    python benchmarks/bench_trial.py --dir /tmp/run10k    # keep the run for next time
    python benchmarks/bench_trial.py --smdebug-python /path/to/smdebug-env/bin/python
    python benchmarks/bench_trial.py --table --dir /tmp/run10k-scalars --smdebug-python /path/to/python
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

# Runs in a fresh interpreter so that imports and caches of one measurement do not help
# the next one. It prints one JSON line, last.
_OURS = r"""
import json, sys, time
t0 = time.perf_counter()
from smdebug.trials import create_trial
t_import = time.perf_counter() - t0
path, name = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
trial = create_trial(path, progress=False)
steps = trial.steps()
t_open = time.perf_counter() - t0
opens_after_open = trial.stats["small_files_read"]
t0 = time.perf_counter()
values = trial.tensor(name).values(progress=False)
t_values = time.perf_counter() - t0
print(json.dumps({
    "import_s": t_import, "open_and_steps_s": t_open, "values_s": t_values,
    "steps": len(steps), "values": len(values),
    "index_files_read": trial.index_files_read,
    "files_opened_by_open": opens_after_open,
    "event_file_opens": trial.stats["event_file_opens"],
}))
"""

_ORIGINAL = r"""
import io, json, sys, time, contextlib
t0 = time.perf_counter()
from smdebug.trials import create_trial
t_import = time.perf_counter() - t0
path, name = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
trial = create_trial(path)
steps = trial.steps()
t_open = time.perf_counter() - t0
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):  # some versions print from value()
    values = trial.tensor(name).values()
t_values = time.perf_counter() - t0
print(json.dumps({"import_s": t_import, "open_and_steps_s": t_open, "values_s": t_values,
                  "steps": len(steps), "values": len(values)}))
"""


# --table: values/s of to_dataframe() and of one call per value.
# The one-call-per-value loop both libraries run (the original's only API): every scalar's
# value and every saved reduction's value of the first ``sample`` steps, one call each.
_VALUE_LOOP = r"""
t0 = time.perf_counter()
count = 0
for name in names:
    tensor = trial.tensor(name)
    if name.startswith("scalar/"):
        for s in steps:
            tensor.value(s).item(); count += 1
    else:
        for s in steps:
            for op in ("min", "max", "mean", "std", "l2"):
                float(tensor.reduction_value(s, op)); count += 1
t_loop = time.perf_counter() - t0
"""

_OURS_TABLE = r"""
import gc, json, sys, time
import pandas  # imported before timing: the read is measured, not the import
from smdebug.trials import create_trial
path, sample = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
trial = create_trial(path, progress=False)
t_open = time.perf_counter() - t0
gc.collect()
t0 = time.perf_counter()
df = trial.to_dataframe(progress=False)
t_df = time.perf_counter() - t0
names = trial.tensor_names()
steps = trial.steps()[:sample]
""" + _VALUE_LOOP + r"""
print(json.dumps({"open_s": t_open, "dataframe_s": t_df, "rows": len(df), "loop_s": t_loop, "loop_values": count}))
"""

_ORIGINAL_TABLE = r"""
import io, json, sys, time, contextlib
from smdebug.trials import create_trial
path, sample = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
trial = create_trial(path)
steps = trial.steps()[:sample]
t_open = time.perf_counter() - t0
names = trial.tensor_names()
with contextlib.redirect_stdout(io.StringIO()):  # the original prints as it reads
""" + "\n".join("    " + line if line else line for line in _VALUE_LOOP.strip("\n").split("\n")) + r"""
print(json.dumps({"open_s": t_open, "loop_s": t_loop, "loop_values": count}))
"""

_TABLE_REDUCTIONS = ("min", "max", "mean", "std", "l2")


def write_scalar_run(out_dir: str, steps: int) -> None:
    """A finished single-worker TRAIN run: per step 5 ``scalar/`` values and 4 tensors
    saved as 5 reductions each (25 one-number records), written by the RunWriter."""
    import numpy as np

    from smdebug.collections import CollectionManager
    from smdebug.modes import ModeKeys
    from smdebug.storage.writer import RunWriter, StepData

    writer = RunWriter(out_dir, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    rng = np.random.default_rng(0)
    for step in range(steps):
        tensors = [(f"scalar/metric{i}", np.asarray(np.float64(rng.random()))) for i in range(5)]
        for i in range(4):
            tensors += [(f"smdebug/reductions/{op}/layer{i}.weight", np.asarray(np.float64(rng.standard_normal())))
                        for op in _TABLE_REDUCTIONS]
        writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker="worker_0",
                               tensors=tensors))
    writer.close()
    open(os.path.join(out_dir, "training_job_end.ts"), "w").close()


def table_benchmark(args, path: str) -> None:
    if not os.path.exists(os.path.join(path, "training_job_end.ts")):
        if os.path.exists(path):
            shutil.rmtree(path)
        t0 = time.perf_counter()
        write_scalar_run(path, args.steps)
        print(f"wrote {args.steps} steps x 25 scalar/reduction records to {path} in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"reusing {path}")
    sample = str(args.sample_steps)
    ours = [run_json(sys.executable, _OURS_TABLE, path, sample) for _ in range(args.repeat)]
    # Medians over the fresh processes (the first pays for a cold page cache, like a user's first read).
    best = statistics.median(r["dataframe_s"] for r in ours)
    rows = ours[-1]["rows"]
    loop = statistics.median(r["loop_s"] / r["loop_values"] for r in ours)
    runs = ", ".join(f"{r['dataframe_s']:.3f}" for r in ours)
    print(f"smdebug-core: create_trial {statistics.median(r['open_s'] for r in ours):.2f} s; to_dataframe() {rows} "
          f"values in {best:.3f} s (median of {len(ours)} processes) = {rows / best:,.0f} values/s (runs: {runs} s); "
          f"one value() call per value: {1 / loop:,.0f} values/s ({ours[-1]['loop_values']} values) -> "
          f"{loop * rows / best:.0f}x")
    if args.smdebug_python:
        env = dict(os.environ)
        env["SMDEBUG_TRAINING_END_DELAY_REFRESH"] = "0"
        theirs = run_json(args.smdebug_python, _ORIGINAL_TABLE, path, sample, env)
        per = theirs["loop_s"] / theirs["loop_values"]
        print(f"original smdebug 1.0.34: create_trial+steps() {theirs['open_s']:.2f} s; one call per value: "
              f"{1 / per:,.0f} values/s ({theirs['loop_values']} values) -> to_dataframe() is {per * rows / best:.0f}x "
              "faster")


def write_run(out_dir: str, steps: int, tensors: int, size: int) -> None:
    """A single-worker TRAIN run: ``tensors`` float32 tensors of ``size`` elements per step."""
    import numpy as np

    from smdebug.collections import CollectionManager
    from smdebug.modes import ModeKeys
    from smdebug.storage.writer import RunWriter, StepData

    writer = RunWriter(out_dir, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    rng = np.random.default_rng(0)
    base = [rng.standard_normal(size).astype(np.float32) for _ in range(tensors)]
    for step in range(steps):
        writer.submit(
            StepData(
                global_step=step,
                mode=ModeKeys.TRAIN,
                mode_step=step,
                worker="worker_0",
                tensors=[(f"layer{i}.weight", base[i] + step) for i in range(tensors)],
            )
        )
    writer.close()


def run_json(python: str, script: str, path: str, name: str, env=None) -> dict:
    proc = subprocess.run(
        [python, "-c", script, path, name], capture_output=True, text=True, env=env, check=False
    )  # ``name``: the tensor to read (--table: the number of steps of the per-call loop)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--tensors", type=int, default=4, help="tensors per step")
    parser.add_argument("--size", type=int, default=64, help="elements per tensor")
    parser.add_argument("--dir", help="where to write the run (reused if it is already complete)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per side; the best is shown")
    parser.add_argument("--smdebug-python", help="an interpreter with the original smdebug installed")
    parser.add_argument("--table", action="store_true",
                        help="values/s of to_dataframe() on a run of --steps x 25 scalar/reduction records")
    parser.add_argument("--sample-steps", type=int, default=400,
                        help="--table: steps read by the one-call-per-value loops (default 400)")
    args = parser.parse_args(argv)

    tmp = None
    path = args.dir
    if path is None:
        tmp = tempfile.mkdtemp(prefix="bench_trial_")
        path = os.path.join(tmp, "run")
    try:
        if args.table:
            table_benchmark(args, path)
            return 0
        if not os.path.exists(os.path.join(path, "training_job_end.ts")):
            if os.path.exists(path):
                shutil.rmtree(path)
            t0 = time.perf_counter()
            write_run(path, args.steps, args.tensors, args.size)
            print(f"wrote {args.steps} steps x {args.tensors} tensors to {path} in {time.perf_counter() - t0:.1f} s")
        else:
            print(f"reusing {path}")
        name = "layer0.weight"

        ours = [run_json(sys.executable, _OURS, path, name) for _ in range(args.repeat)]
        best = {k: min(r[k] for r in ours) for k in ("open_and_steps_s", "values_s")}
        last = ours[-1]
        print(
            f"smdebug-core: create_trial+steps() {best['open_and_steps_s']:.3f} s "
            f"({last['steps']} steps, {last['index_files_read']} index files read, "
            f"{last['files_opened_by_open']} files opened); "
            f"values() of one tensor {best['values_s']:.3f} s "
            f"({last['values']} values, {last['event_file_opens']} event files opened)"
        )

        if args.smdebug_python:
            env = dict(os.environ)
            # The original sleeps this long after seeing the end marker; we time reading only.
            env["SMDEBUG_TRAINING_END_DELAY_REFRESH"] = "0"
            theirs = [run_json(args.smdebug_python, _ORIGINAL, path, name, env) for _ in range(args.repeat)]
            tb = {k: min(r[k] for r in theirs) for k in ("open_and_steps_s", "values_s")}
            if theirs[-1]["steps"] != last["steps"] or theirs[-1]["values"] != last["values"]:
                print(f"WARNING: the original saw {theirs[-1]['steps']} steps / {theirs[-1]['values']} values")
            print(
                f"original smdebug: create_trial+steps() {tb['open_and_steps_s']:.3f} s; "
                f"values() {tb['values_s']:.3f} s (SMDEBUG_TRAINING_END_DELAY_REFRESH=0)"
            )
            print(
                f"ratio original/ours: open {tb['open_and_steps_s'] / best['open_and_steps_s']:.1f}x, "
                f"values {tb['values_s'] / best['values_s']:.1f}x"
            )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

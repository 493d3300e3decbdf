"""How long comparing two runs and exporting one to partitioned Parquet take.

Writes two identical finished runs of ``--steps`` steps (one worker, TRAIN): per step 5
``scalar/`` values, 4 tensors saved as 5 reductions each and ``--full`` float32 tensors of
``--size`` elements saved whole. Identical runs are the slow case: the divergence search
walks every step. Then, ``--repeat`` times with freshly opened trials, medians printed:

1. ``compare([a, b], full_tensors=False)``: scalars and saved reductions only;
2. ``compare([a, b])``: also every saved full tensor, element by element;
3. ``trial.to_parquet(dir)`` of one run (with ``pyarrow`` installed).

One untimed comparison first: imports (pandas) and the page cache are not measured.

    python benchmarks/bench_compare.py                    # 1,000 steps in a temp dir
    python benchmarks/bench_compare.py --steps 10000 --dir /tmp/cmp10k
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

_REDUCTIONS = ("min", "max", "mean", "std", "l2")


def write_run(out_dir: str, steps: int, full: int, size: int) -> None:
    import numpy as np

    from smdebug.collections import CollectionManager
    from smdebug.modes import ModeKeys
    from smdebug.storage.writer import RunWriter, StepData

    writer = RunWriter(out_dir, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    rng = np.random.default_rng(0)
    for step in range(steps):
        tensors = [(f"layer{i}.weight", rng.standard_normal(size).astype(np.float32)) for i in range(full)]
        for i in range(4):
            tensors += [(f"smdebug/reductions/{op}/grad{i}", np.asarray(np.float64(rng.standard_normal())))
                        for op in _REDUCTIONS]
        tensors += [(f"scalar/metric{i}", np.asarray(np.float64(rng.random()))) for i in range(5)]
        writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker="worker_0",
                               tensors=tensors))
    writer.close()
    open(os.path.join(out_dir, "training_job_end.ts"), "w").close()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--full", type=int, default=4, help="full tensors per step")
    parser.add_argument("--size", type=int, default=256, help="elements per full tensor")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to write the two runs (reused when complete)")
    args = parser.parse_args(argv)

    from smdebug.analysis import compare
    from smdebug.trials import create_trial

    base = args.dir or tempfile.mkdtemp(prefix="bench_compare_")
    a, b = os.path.join(base, "a"), os.path.join(base, "b")
    if not os.path.exists(os.path.join(b, "training_job_end.ts")):
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)
        write_run(a, args.steps, args.full, args.size)
        shutil.copytree(a, b)
    print(f"runs: {args.steps} steps x (5 scalars + 4 tensors x 5 reductions + {args.full} full tensors of "
          f"{args.size} float32) in {base}")

    def both():
        return [create_trial(a, progress=False), create_trial(b, progress=False)]

    compare(both(), full_tensors=False, progress=False)  # imports (pandas) and page cache, untimed
    scalars, full, export = [], [], []
    for _ in range(args.repeat):
        trials = both()
        result = None

        def run_scalars():
            nonlocal result
            result = compare(trials, full_tensors=False, progress=False)

        scalars.append(timed(run_scalars))
        assert not result.diverged
        values = result.compared["values"]
        trials = both()
        full.append(timed(lambda: compare(trials, progress=False)))
        try:
            import pyarrow  # noqa: F401 - only whether Parquet can be measured
        except ImportError:
            continue
        out = tempfile.mkdtemp(prefix="bench_parquet_")
        shutil.rmtree(out)
        trial = create_trial(a, progress=False)
        export.append(timed(lambda: trial.to_parquet(out)))
        shutil.rmtree(out)
    med = statistics.median
    print(f"compare, scalars and reductions only: {med(scalars):.2f} s for {values} values per run "
          f"(median of {len(scalars)}; runs {', '.join(f'{s:.2f}' for s in scalars)} s)")
    print(f"compare, with {args.steps * args.full} full tensors per run: {med(full):.2f} s "
          f"(runs {', '.join(f'{s:.2f}' for s in full)} s)")
    if export:
        print(f"to_parquet of one run: {med(export):.2f} s (runs {', '.join(f'{s:.2f}' for s in export)} s)")
    if not args.dir:
        shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long ``smdebug report`` takes, and how large its file is, for runs of 1,000 and 10,000
steps x 20 and 200 layers (targets for 10,000 x 200: at most 10 s and 5 MB).

Each run is written once (numpy hook, one worker) into ``--dir`` and kept for next time:
per layer, the gradient's L2 norm and absolute maximum at every step, the weight whole
every ``steps // 10`` steps (8x8 floats), a loss at every step, and an EVAL pass of 10
steps every ``steps // 5`` training steps. Then, in a fresh process per size, the trial is
opened (``create_trial``: the run's index files) and the report written (default rules
included, within their default time budget); the best of ``--repeat`` is printed: the
opening, the report after it, their total (imports included) and the file's size.

    python benchmarks/bench_report.py --dir /tmp/bench_report            # all four sizes
    python benchmarks/bench_report.py --dir /tmp/bench_report --sizes 10000x200
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_MEASURE = r"""
import json, os, sys, time
t0 = time.perf_counter()
from smdebug.analysis.report import write_report
from smdebug.trials import create_trial
trial = create_trial(sys.argv[1], progress=False)
t1 = time.perf_counter()
write_report(trial, sys.argv[2], progress=False)
t2 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "report": t2 - t1, "seconds": t2 - t0, "bytes": os.path.getsize(sys.argv[2])}))
"""


def write_run(path: str, steps: int, layers: int) -> None:
    import numpy as np

    import smdebug as smd

    rng = np.random.default_rng(0)
    hook = smd.Hook(out_dir=path, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses", "grads"])
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=max(1, steps // 10))
    grads = hook.get_collection("grads")
    grads.include("^gradient/")
    grads.reduction_config = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"])
    weights = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(layers)]
    scales = np.logspace(0, -3, layers)
    eval_every = max(1, steps // 5)
    train_step = 0
    while train_step < steps:
        hook.set_mode(smd.modes.TRAIN)
        hook.begin_step()
        for layer in range(layers):
            grad = (rng.standard_normal((8, 8)) * scales[layer]).astype(np.float32)
            hook.save_tensor(f"Net_layers.{layer}.weight", weights[layer], "weights")
            hook.save_tensor(f"gradient/Net_layers.{layer}.weight", grad, "grads")
            weights[layer] -= 0.01 * grad
        hook.save_tensor("loss", np.float32(2.0 / (1 + train_step) ** 0.5 + 0.05 * rng.random()), "losses")
        train_step += 1
        if train_step % eval_every == 0:
            hook.set_mode(smd.modes.EVAL)
            for _ in range(10):
                hook.begin_step()
                hook.save_tensor("loss", np.float32(2.2 / (1 + train_step) ** 0.5), "losses")
    hook.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="where the runs are written and kept")
    parser.add_argument("--sizes", default="1000x20,1000x200,10000x20,10000x200",
                        help="STEPSxLAYERS, comma-separated")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    print(f"{'run':<12} {'write run s':>11} {'open s':>7} {'report s':>9} {'total s':>8} {'MB':>6}")
    for size in args.sizes.split(","):
        steps, layers = (int(x) for x in size.lower().split("x"))
        run = os.path.join(args.dir, f"run_{steps}x{layers}")
        written = ""
        if not os.path.exists(os.path.join(run, "training_job_end.ts")):
            t0 = time.perf_counter()
            write_run(run, steps, layers)
            written = f"{time.perf_counter() - t0:.1f}"
        out = os.path.join(args.dir, f"report_{steps}x{layers}.html")
        best = None
        for _ in range(args.repeat):
            proc = subprocess.run([sys.executable, "-c", _MEASURE, run, out], env=env, capture_output=True, text=True,
                                  check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            best = result if best is None or result["seconds"] < best["seconds"] else best
        print(f"{size:<12} {written:>11} {best['open']:>7.2f} {best['report']:>9.2f} {best['seconds']:>8.2f} "
              f"{best['bytes'] / 1e6:>6.2f}", flush=True)


if __name__ == "__main__":
    main()

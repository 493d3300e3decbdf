"""Training-time overhead of the smdebug XGBoost hook.

Trains the same model (``--rows`` x ``--features`` random data, ``--rounds`` rounds,
``nthread=2``, hist, depth 6, train and validation metrics every round) several times
in one process, interleaving three configurations so that machine noise hits them all
alike:

* ``baseline``: no hook;
* ``default``: ``smd.Hook(out_dir)``, i.e. the metrics every 10 rounds;
* ``all``: every XGBoost collection every 10 rounds (hyperparameters, metrics,
  predictions and labels on the validation set, feature importance, full and average
  SHAP on ``--shap-rows`` training rows, trees).

Prints each run's wall and CPU seconds and the seconds the training thread spent inside
the hook, then per configuration the median and best, the ratio of medians to the
baseline, and the hook's share of the baseline's wall time. On a shared machine the
time inside the hook is the steadiest figure; CPU time (every thread of the process,
the writer's included) comes next. SHAP is by far the costliest collection (TreeSHAP on every row
and tree); ``--shap-rows`` sets how many training rows it is computed on.

    python benchmarks/bench_xgboost.py                      # 100,000 x 50, 100 rounds, 3 repeats
    python benchmarks/bench_xgboost.py --repeats 5 --shap-rows 1000
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

# Idle OpenMP threads sleep instead of spinning, so that CPU time measures work done even
# when other programs compete for the cores. Set before xgboost loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import xgboost as xgb

import smdebug.xgboost as smd

ALL_COLLECTIONS = ["hyperparameters", "metrics", "predictions", "labels", "feature_importance", "average_shap",
                   "full_shap", "trees"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="training rows")
    parser.add_argument("--valid-rows", type=int, default=20_000, help="validation rows")
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--shap-rows", type=int, default=1_000, help="training rows SHAP values are computed on")
    parser.add_argument("--configs", default="baseline,default,all", help="comma-separated subset to run")
    return parser.parse_args(argv)


def make_data(rows, valid_rows, features, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows + valid_rows, features)).astype(np.float32)
    logits = X[:, :5] @ np.array([1.5, -1.0, 0.8, 0.5, -0.3], dtype=np.float32) + 0.5 * X[:, 5] * X[:, 6]
    y = (logits + rng.normal(size=len(X)) > 0).astype(np.float32)
    return X[:rows], y[:rows], X[rows:], y[rows:]


def make_hook(config, out_dir, data, shap_rows):
    X, y, Xv, yv = data
    if config == "baseline":
        return None
    if config == "default":
        return smd.Hook(out_dir)
    if config == "all":
        return smd.Hook(out_dir, include_collections=ALL_COLLECTIONS, train_data=(X[:shap_rows], y[:shap_rows]),
                        validation_data=(Xv, yv))
    raise ValueError(f"unknown configuration {config!r}; allowed: baseline, default, all")


def _timed(method, spent):
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start
    return call


def run_once(config, data, matrices, rounds, shap_rows, scratch):
    """One training; returns (wall s, process CPU s, s spent inside the hook on the training thread)."""
    out_dir = tempfile.mkdtemp(prefix=f"{config}_", dir=scratch)
    hook = make_hook(config, out_dir, data, shap_rows)
    in_hook = [0.0]
    if hook is not None:
        for name in ("before_training", "after_iteration", "after_training", "close"):
            setattr(hook, name, _timed(getattr(hook, name), in_hook))
    dtrain, dvalid = matrices
    params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 6, "nthread": 2,
              "eval_metric": ["logloss", "auc"]}
    start, start_cpu = time.perf_counter(), time.process_time()
    booster = xgb.train(params, dtrain, rounds, evals=[(dtrain, "train"), (dvalid, "valid")],
                        callbacks=[hook] if hook is not None else None, verbose_eval=False)
    if hook is not None:
        hook.close()  # the last step's data is on disk when the timer stops
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    if booster.num_boosted_rounds() != rounds:
        raise RuntimeError(f"{config}: trained {booster.num_boosted_rounds()} rounds instead of {rounds}")
    shutil.rmtree(out_dir, ignore_errors=True)
    return seconds, cpu_seconds, in_hook[0]


def main(argv=None):
    args = parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    data = make_data(args.rows, args.valid_rows, args.features)
    X, y, Xv, yv = data
    matrices = (xgb.DMatrix(X, y, nthread=2), xgb.DMatrix(Xv, yv, nthread=2))
    print(f"xgboost {xgb.__version__}; {args.rows:,} x {args.features} train, {args.valid_rows:,} valid, "
          f"{args.rounds} rounds, nthread=2, SHAP on {args.shap_rows:,} rows; {args.repeats} repeats", flush=True)

    times = {c: [] for c in configs}  # (wall seconds, CPU seconds of the process) per run
    with tempfile.TemporaryDirectory(prefix="bench_xgboost_") as scratch:
        run_once("baseline", data, matrices, min(args.rounds, 10), args.shap_rows, scratch)  # warm-up
        for repeat in range(args.repeats):
            # Rotate the order so that no configuration always runs first (or last).
            order = configs[repeat % len(configs):] + configs[:repeat % len(configs)]
            for config in order:
                wall, cpu, in_hook = run_once(config, data, matrices, args.rounds, args.shap_rows, scratch)
                times[config].append((wall, cpu, in_hook))
                print(f"  repeat {repeat} {config:>8}: {wall:7.2f} s wall {cpu:7.2f} s CPU "
                      f"{in_hook:7.3f} s in the hook", flush=True)

    # CPU time (all threads of this process: xgboost's and the writer's) is what the hook
    # adds; it is also far less sensitive than wall time to other programs on the machine.
    # "hook s" is the time the training thread spent inside the hook's callbacks: the
    # steadiest figure of all, since it does not depend on the training's own noise.
    print(f"\n{'config':>8} {'wall med':>9} {'wall best':>9} {'CPU med':>8} {'CPU best':>8} {'hook s':>7}"
          f" {'wall x':>7} {'CPU x':>7} {'hook %':>7}   (x: median / baseline median)")
    base = times.get("baseline")
    for config in configs:
        walls, cpus, hooks = ([t[i] for t in times[config]] for i in range(3))
        row = f"{config:>8} {statistics.median(walls):9.2f} {min(walls):9.2f} {statistics.median(cpus):8.2f} " \
              f"{min(cpus):8.2f} {statistics.median(hooks):7.3f}"
        if base:
            base_wall = statistics.median([t[0] for t in base])
            row += f" {statistics.median(walls) / base_wall:7.3f}" \
                   f" {statistics.median(cpus) / statistics.median([t[1] for t in base]):7.3f}" \
                   f" {100 * statistics.median(hooks) / base_wall:6.2f}%"
        print(row)
    return times


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

"""The hook alone against the hook forwarding to W&B (offline) or MLflow (SQLite): a numpy loop of
100 layers and 300 steps, 3 reductions a layer saved every step.

    WANDB_MODE=offline WANDB_DIR=/tmp/w python benchmarks/bench_trackers.py none wandb mlflow

``GROUPED=table|histogram`` chooses the W&B grouping. Prints, per kind: the training loop's
seconds, those with close(), and the sink's counts.
"""
import os
import sys
import tempfile
import time

import numpy as np

import smdebug as smd


def run(kind, steps=300, layers=100):
    d = tempfile.mkdtemp()
    hook = smd.Hook(out_dir=d + "/run", include_collections=["weights"],
                    reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]),
                    save_config=smd.SaveConfig(save_interval=1))
    sink = None
    if kind == "wandb":
        sink = smd.sinks.WandbSink(grouped=os.environ.get("GROUPED", "histogram"))
    elif kind == "mlflow":
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{d}/m.db"
        sink = smd.sinks.MlflowSink()
    if sink is not None:
        hook.add_sink(sink)
    ws = [np.random.default_rng(i).standard_normal((64, 64)) for i in range(layers)]
    x = np.random.default_rng(0).standard_normal((64, 64))
    t0 = time.perf_counter()
    for _ in range(steps):
        hook.begin_step()
        y = x
        for i, w in enumerate(ws):
            y = np.tanh(y @ w)
            hook.record(f"layer{i}.weight", w)
        hook.save_scalar("loss", float(y.mean()))
    hook.end_step()
    loop = time.perf_counter() - t0
    hook.close()
    return loop, time.perf_counter() - t0, sink.counts if sink else None


if __name__ == "__main__":
    for kind in sys.argv[1:]:
        print(kind, run(kind))

"""Two real XGBoost workers joined by xgboost's collective: each writes as its own rank."""
import json
import subprocess
import sys

import pytest

xgb = pytest.importorskip("xgboost")
tracker_module = pytest.importorskip("xgboost.tracker")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

WORKER = """
import json, sys
import numpy as np
import xgboost as xgb
from xgboost import collective
import smdebug.xgboost as smd
from smdebug.xgboost import _collect

tree_tables = []
original_tree_tensors = _collect.tree_tensors
_collect.tree_tensors = lambda booster: tree_tables.append(1) or original_tree_tensors(booster)

args, out, include_workers = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with collective.CommunicatorContext(**args):
    rank = collective.get_rank()
    rng = np.random.default_rng(rank)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] > 0).astype(float)
    hook = smd.Hook(out, include_workers=include_workers, save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["trees"])
    dtrain = xgb.DMatrix(X, y)
    xgb.train({"objective": "binary:logistic", "nthread": 1, "tree_method": "hist"}, dtrain, 4,
              evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    print(json.dumps({"rank": hook.rank, "world_size": hook.world_size, "worker": hook.worker_name,
                      "tree_tables": len(tree_tables)}))
    hook.close()
"""


def run_workers(tmp_path, include_workers):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / f"run_{include_workers}")
    tracker = tracker_module.RabitTracker(host_ip="127.0.0.1", n_workers=2)
    tracker.start()
    args = json.dumps(tracker.worker_args())
    procs = [subprocess.Popen([sys.executable, str(script), args, out, include_workers],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    reports = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    tracker.wait_for(60)
    return out, sorted(reports, key=lambda r: r["rank"])


def test_rank_and_world_size_come_from_the_collective(tmp_path):
    out, reports = run_workers(tmp_path, "all")
    assert reports == [{"rank": 0, "world_size": 2, "worker": "worker_0", "tree_tables": 2},
                       {"rank": 1, "world_size": 2, "worker": "worker_1", "tree_tables": 2}]
    trial = create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 2]
    assert trial.tensor("train-logloss").workers(2) == ["worker_0", "worker_1"]
    assert trial.tensor("trees/Node").workers(2) == ["worker_0", "worker_1"]


def test_only_the_chief_computes_and_writes_with_include_workers_one(tmp_path):
    out, reports = run_workers(tmp_path, "one")
    assert [(r["rank"], r["tree_tables"]) for r in reports] == [(0, 2), (1, 0)]
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"]
    assert trial.tensor("trees/Node").steps() == [0, 2]


def test_single_process_is_rank_0_of_1(run_dir):
    hook = smd.Hook(run_dir, dry_run=True)
    assert (hook.rank, hook.world_size) == (0, 1)
    hook.close()

"""Fixed-seed runs whose files must not change when the capture path is restructured.

``digest(out_dir)`` describes a run directory's files independently of when they were
written: every file's relative path; for event files, each record's tag and a SHA-256 of
its payload with the Event's ``wall_time`` zeroed (reduction records: their value, which
is compared with a relative tolerance, see :func:`compare`); index files with their
``crc32c`` keys dropped (they hash payloads that hold wall times); collections files as
they are. Record order and byte offsets are part of the digest.

Regenerate a golden file (only when a change of the files is intended, and say why in the
commit)::

    python tests/golden/golden_runs.py pytorch > tests/golden/pytorch.json
    python tests/golden/golden_runs.py numpy > tests/golden/numpy.json
    python tests/golden/golden_runs.py xgboost > tests/golden/xgboost.json   (an env with xgboost)
    python tests/golden/golden_runs.py numpy store > tests/golden/numpy.store.json   (the run store's rows)

The PyTorch and numpy digests were recorded before the step pipeline replaced the capture
path (issue 18) and have changed only where a change of the files was intended (issue 25:
collections files list the tensors their regexes matched; issue 36: numbers given to save_scalar
are stored as shape [1], XGBoost's SHAP values, importances and hyperparameters as 1.0.34
saved them; issue 35: PyTorch has the ``updates`` and ``router`` collections; issue 46: XGBoost's
``average_abs_shap`` collection exists only when asked for); the XGBoost digest was recorded
after the first of those changes. The PyTorch digest was re-recorded with float tensors as
fingerprints (:func:`_tensor_digest`) when CI moved to a CPU whose float32 kernels round
differently; the run's files themselves did not change.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import numpy as np

REDUCTION_PREFIX = "smdebug/reductions/"
#: Reductions may be computed by another algorithm (float64 instead of float32 sums):
#: their values are compared to this relative tolerance, everything else bit for bit.
REDUCTION_RTOL = 1e-6
#: Whole float tensors and reductions near zero are compared to this fraction of their
#: tensor's scale: PyTorch's float32 kernels round differently on CPUs with other SIMD widths,
#: and a few training steps carry that into the weights. A restructuring that saves another
#: tensor, step or value moves them by far more.
TENSOR_RTOL = 1e-4


def _normalized_payload(payload: bytes) -> bytes:
    # An Event starts with field 1 (wall_time, a double: key byte 0x09 and 8 bytes) when set.
    if payload[:1] == b"\x09":
        return payload[:1] + bytes(8) + payload[9:]
    return payload


def digest(out_dir: str) -> dict:
    from smdebug.storage.format.codec import decode_tensor_event
    from smdebug.storage.format.records import iter_records

    files = {}
    for root, dirs, names in os.walk(out_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, out_dir)
            if rel.split(os.sep)[0] == "tensorboard":
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if rel.endswith(".parquet"):  # the run store (docs/format.md 10): rows, wall times aside
                files[rel] = _store_rows(path)
            elif rel.endswith((".tfevents", ".events")):
                records = []
                for payload in iter_records(data):
                    payload = bytes(payload)
                    decoded = decode_tensor_event(payload)
                    tag, value = decoded.tag, decoded.value
                    if tag.startswith(REDUCTION_PREFIX):
                        records.append([tag, float(np.asarray(value, dtype=np.float64).reshape(-1)[0])])
                    else:
                        records.append([tag, _tensor_digest(_normalized_payload(payload), np.asarray(value))])
                files[rel] = records
            elif rel.startswith("index" + os.sep):
                doc = json.loads(data)
                for entry in doc.get("tensor_payload", []):
                    entry.pop("crc32c", None)
                files[rel] = doc
            else:
                files[rel] = hashlib.sha256(data).hexdigest()
    return files


def _tensor_digest(payload: bytes, value: np.ndarray):
    """A whole tensor's record: its payload's SHA-256; for floating tensors also the payload's
    SHA-256 with the values zeroed (``frame``: tag, step, mode, dtype, shape) and a fingerprint
    of the values, so that float results that differ in their last bits between CPUs (SIMD
    widths change summation order) compare with a tolerance instead of failing."""
    sha = hashlib.sha256(payload).hexdigest()
    if value.dtype.kind != "f" or value.size == 0:
        return sha
    content = value.tobytes()
    at = payload.rfind(content)
    if at < 0:
        return sha
    frame = payload[:at] + bytes(len(content)) + payload[at + len(content):]
    flat = value.astype(np.float64).reshape(-1)
    return {"sha": sha, "frame": hashlib.sha256(frame).hexdigest(), "size": int(flat.size),
            "sum": float(flat.sum()), "abs_sum": float(np.abs(flat).sum()),
            "abs_max": float(np.abs(flat).max()), "head": [float(v) for v in flat[:4]]}


def _tensor_problems(want, got) -> list:
    """How a whole tensor's record differs from the golden one (see :func:`_tensor_digest`)."""
    if isinstance(want, str):  # recorded bit for bit
        return [] if want == (got["sha"] if isinstance(got, dict) else got) else ["differs"]
    if not isinstance(got, dict) or got["frame"] != want["frame"] or got["size"] != want["size"]:
        return ["differs (tag, step, dtype or shape)"]
    scale = TENSOR_RTOL * want["abs_max"]
    checks = [("sum", TENSOR_RTOL * want["abs_sum"]), ("abs_sum", TENSOR_RTOL * want["abs_sum"]),
              ("abs_max", scale)]
    problems = [f"{key} = {got[key]!r}, expected {want[key]!r}" for key, tol in checks
                if not math.isclose(want[key], got[key], rel_tol=0, abs_tol=tol + 1e-30)]
    for i, (a, b) in enumerate(zip(want["head"], got["head"])):
        if not math.isclose(a, b, rel_tol=0, abs_tol=scale + 1e-30):
            problems.append(f"value [{i}] = {b!r}, expected {a!r}")
    return problems


def _reduction_scales(records: list) -> dict:
    """Per tensor, the largest magnitude among its reductions in one file: the scale against
    which a reduction that is near zero by cancellation (the mean of a softmax layer's
    gradient) is compared, since its relative error is unbounded."""
    scales: dict = {}
    for tag, value in records:
        if tag.startswith(REDUCTION_PREFIX) and isinstance(value, float) and math.isfinite(value):
            tensor = tag[len(REDUCTION_PREFIX):].split("/", 1)[-1]
            scales[tensor] = max(scales.get(tensor, 0.0), abs(value))
    return scales


def _store_rows(path: str) -> list:
    """A run store file's rows as ``[key, value]``: a statistics row's value is its number
    (compared like a reduction record's when it is a reduction), a tensors row's is its columns."""
    import pyarrow.parquet as pq

    rows = []
    for row in pq.read_table(path).to_pylist():
        row.pop("wall_time", None)
        row.pop("crc32c", None)  # of a payload that holds the wall time
        if "value" in row:
            value = row.pop("value")
            key = "|".join(str(row[k]) for k in ("step", "mode", "mode_step", "tensor", "reduction", "dtype", "ndim"))
            rows.append([(REDUCTION_PREFIX if row["reduction"] else "") + key, value])
        else:
            rows.append([f"{row['step']}|{row['tensor']}", json.dumps(row, sort_keys=True)])
    return rows


def compare(expected: dict, actual: dict) -> list:
    """Differences between two digests, as readable lines (empty: the same files)."""
    problems = []
    if sorted(expected) != sorted(actual):
        problems.append(f"file sets differ: only expected {sorted(set(expected) - set(actual))[:5]}, "
                        f"only actual {sorted(set(actual) - set(expected))[:5]}")
    for rel in sorted(set(expected) & set(actual)):
        want, got = expected[rel], actual[rel]
        if rel.endswith((".tfevents", ".events", ".parquet")):
            if [t for t, _ in want] != [t for t, _ in got]:
                problems.append(f"{rel}: record tags/order differ: {[t for t, _ in want][:6]} vs "
                                f"{[t for t, _ in got][:6]}")
                continue
            scales = _reduction_scales(want)
            for (tag, a), (_, b) in zip(want, got):
                if isinstance(a, float) and not tag.startswith(REDUCTION_PREFIX):
                    if not (a == b or (math.isnan(a) and math.isnan(b))):
                        problems.append(f"{rel}: {tag} = {b!r}, expected {a!r}")
                elif isinstance(a, float):
                    scale = scales.get(tag[len(REDUCTION_PREFIX):].split("/", 1)[-1], 0.0)
                    if not (math.isclose(a, b, rel_tol=REDUCTION_RTOL, abs_tol=max(1e-12, TENSOR_RTOL * scale))
                            or (math.isnan(a) and math.isnan(b))):
                        problems.append(f"{rel}: {tag} = {b!r}, expected {a!r}")
                elif rel.endswith((".tfevents", ".events")):
                    problems.extend(f"{rel}: record {tag} {p}" for p in _tensor_problems(a, b))
                elif a != b:
                    problems.append(f"{rel}: record {tag} differs")
        elif want != got:
            problems.append(f"{rel} differs")
    return problems


# --- the runs ---------------------------------------------------------------------------------
def run_pytorch(out_dir: str) -> None:
    import torch

    import smdebug.pytorch as smd

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses", "outputs_red"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std", "variance", "sum"], abs_reductions=["max"], norms=["l1", "l2"])
    outputs = hook.get_collection("outputs_red")
    outputs.include(r"^\d+_output_0$")
    outputs.reduction_config = smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"], save_shape=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 1, 8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(3)]
    for step in range(5):
        x, y = data[step % 3]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        hook.save_scalar("lr", 0.1)
    model.eval()
    with torch.no_grad():
        for x, y in data[:2]:
            loss_fn(model(x), y)
    hook.close()


def run_numpy(out_dir: str) -> None:
    import smdebug as smd

    rng = np.random.default_rng(0)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2),
                    reduction_config=smd.ReductionConfig(reductions=["min", "mean"], norms=["l2"],
                                                         save_raw_tensor=True))
    weights = rng.standard_normal((6, 5)).astype(np.float32)
    for step in range(6):
        hook.begin_step()
        hook.save_tensor("w", weights, "weights")
        hook.save_tensor("counts", np.arange(step, step + 4, dtype=np.int64), "custom")
        hook.save_scalar("loss", float(np.sum(weights ** 2)))
        weights -= 0.01 * weights
    hook.close()


def run_xgboost(out_dir: str) -> None:
    import xgboost as xgb

    import smdebug.xgboost as smd

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 5))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.float64)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["metrics", "feature_importance", "average_shap", "hyperparameters"],
                    hyperparameters={"max_depth": 2, "objective": "binary:logistic"}, train_data=(X[:150], y[:150]))
    dtrain = xgb.DMatrix(X[:150], y[:150])
    dvalid = xgb.DMatrix(X[150:], y[150:])
    xgb.train({"objective": "binary:logistic", "max_depth": 2, "nthread": 1, "seed": 0, "eval_metric": "logloss"},
              dtrain, 6, evals=[(dtrain, "train"), (dvalid, "valid")], callbacks=[hook], verbose_eval=False)
    hook.close()


RUNS = {"pytorch": run_pytorch, "numpy": run_numpy, "xgboost": run_xgboost}


def _golden_file(name: str, layout: str) -> str:
    suffix = "" if layout == "smdebug-1.0.34" else f".{layout}"
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}{suffix}.json")


def _run(name: str, out_dir: str, layout: str) -> None:
    saved = os.environ.get("SMDEBUG_LAYOUT")
    os.environ["SMDEBUG_LAYOUT"] = layout
    try:
        RUNS[name](out_dir)
    finally:
        if saved is None:
            os.environ.pop("SMDEBUG_LAYOUT")
        else:
            os.environ["SMDEBUG_LAYOUT"] = saved


def check(name: str, out_dir: str, layout: str = "smdebug-1.0.34") -> list:
    """Run ``name`` into ``out_dir`` in ``layout``; the differences from its golden file
    (``<name>.json`` for smdebug-1.0.34, ``<name>.store.json`` for the run store; empty: none)."""
    _run(name, out_dir, layout)
    with open(_golden_file(name, layout)) as handle:
        return compare(json.load(handle), digest(out_dir))


def main(argv):
    import tempfile

    name, *layout = argv
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "run")
        _run(name, out_dir, layout[0] if layout else "smdebug-1.0.34")
        json.dump(digest(out_dir), sys.stdout, indent=0, sort_keys=True)
        sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])

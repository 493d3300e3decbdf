"""The ORIGINAL smdebug 1.0.34 reads what our hook writes.

We write a run with our numpy ``Hook``: two workers (two hooks, ``include_workers="all"``,
world size 2), TRAIN/EVAL/TRAIN phases as in docs/format.md 1.1, every dtype, reductions of every
kind, shape-only entries, ``save_scalar``, a 0-d tensor and a 1-D string tensor. Then
original_dump_trial.py, run by the original's interpreter, opens it with the original's
``create_trial`` and dumps everything it reads; we compare that with what we wrote.

Dtypes the original cannot read natively (int8, int16, uint16, uint32, complex64, bfloat16)
are written widened to one it can (docs/format.md 2.3, codec.py), so the original must see the
same numbers in the wider dtype. uint64 values of 2**63 and above have no such dtype: the
original cannot read those (a KeyError), which is the one documented exception.
"""
import math
import os

import ml_dtypes
import numpy as np
import pytest

import smdebug as smd
from compat_json import decode_array
from compat_runner import load_json, ranked_hook, run_original
from smdebug.storage.format import layout
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial

WORKERS = ("worker_0", "worker_1")
PHASES = ((ModeKeys.TRAIN, 4), (ModeKeys.EVAL, 3), (ModeKeys.TRAIN, 2))  # docs/format.md 1.1
SAVE_INTERVAL = 2

# dtype written -> dtype the original reads it back as (same numbers).
ORIGINAL_SEES = {
    "float16": "float16", "float32": "float32", "float64": "float64", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "bool": "bool", "complex128": "complex128",
    "int8": "int32", "int16": "int32", "uint16": "int32", "uint32": "int64", "complex64": "complex128",
    "bfloat16": "float32", "uint64": "int64",  # uint64 below 2**63 goes out as int64
}
ALL_REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod")
REDUCED = smd.ReductionConfig(reductions=ALL_REDUCTIONS, abs_reductions=ALL_REDUCTIONS, norms=["l1", "l2"],
                              abs_norms=["l1", "l2"], save_raw_tensor=True)
REDUCED_ONLY = smd.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"], abs_reductions=["max"],
                                   abs_norms=["l1"])
SHAPES = smd.ReductionConfig(save_shape=True, reductions=["mean"])



def _dtype_values(rng, g, rank):
    out = {}
    for name in ORIGINAL_SEES:
        if name == "bfloat16":
            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(name)
        shape = (3, 4) if name != "float64" else (2, 3, 2)
        if dtype.kind == "b":
            value = rng.random(shape) > 0.5
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            high = min(int(info.max), 2**63 - 1)  # uint64 above 2**63 is tested on its own
            value = rng.integers(int(info.min), high, size=shape, dtype=dtype, endpoint=True)
            value.flat[0], value.flat[1] = info.min, high  # the extremes
        elif dtype.kind == "c":
            value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        else:
            value = (rng.standard_normal(shape) * 10).astype(dtype)
            value.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
        out[f"dtypes/{name}"] = value
    out["dtypes/uint64_big"] = np.array([2**64 - 1, 2**63, g + rank], dtype=np.uint64)
    return out


def _step_values(g, mode, rank):
    """Every tensor one worker saves at global step ``g``: {name: (collection, value)}."""
    rng = np.random.default_rng(1000 * g + rank)
    values = {name: ("dtypes", v) for name, v in _dtype_values(rng, g, rank).items()}
    values["misc/zero_d"] = ("misc", np.array(g + 0.25 * rank))
    values["misc/text"] = ("misc", np.array(["alpha", "βeta ✓", f"step {g} rank {rank}"]))
    values["misc/row"] = ("misc", np.arange(5, dtype=np.int64) + g)
    values["reduced/w"] = ("reduced", rng.standard_normal((4, 5)).astype(np.float32))
    values["reduced_only/g"] = ("reduced_only", rng.standard_normal((2, 3, 4)))
    values["shapes/act"] = ("shapes", rng.standard_normal((2, 7)).astype(np.float32))
    values["losses/loss"] = ("losses", np.float32(1.0 / (g + 1)))
    if mode is ModeKeys.EVAL:
        values["eval_only/accuracy"] = ("misc", np.array([0.5 + 0.01 * g]))
    if rank == 1:
        values["rank1_only/x"] = ("misc", np.full((2, 2), g, dtype=np.int32))
    return values


def write_our_run(run_dir):
    """Write the run; returns what was written: {"steps": {g: (mode, mode_step)}, "values": {(g, worker): {...}}}."""
    hooks = [
        ranked_hook(rank, out_dir=run_dir, save_config=smd.SaveConfig(save_interval=SAVE_INTERVAL),
                   include_workers="all")
        for rank in (0, 1)
    ]
    for hook in hooks:
        hook.get_collection("reduced").reduction_config = REDUCED
        hook.get_collection("reduced_only").reduction_config = REDUCED_ONLY
        hook.get_collection("shapes").reduction_config = SHAPES
    steps, values = {}, {}
    for mode, count in PHASES:
        for hook in hooks:
            hook.set_mode(mode)
        for _ in range(count):
            for rank, hook in enumerate(hooks):
                if not hook.begin_step():
                    continue
                g = hook.global_step
                steps[g] = (mode, hook.mode_step)
                written = {}
                for name, (collection, value) in _step_values(g, mode, rank).items():
                    hook.save_tensor(name, value, collection)
                    written[name] = value
                lr = 0.1 / (g + 1) + rank
                hook.save_scalar("lr", lr)
                written["scalar/lr"] = np.asarray([lr])  # a number: stored as (1,), as 1.0.34 stores it
                values[(g, WORKERS[rank])] = written
    for hook in hooks:
        hook.close()
    return {"steps": steps, "values": values}


@pytest.fixture(scope="module", params=["written", "converted"])
def our_run(original_python, tmp_path_factory, request):
    """(run dir, what we wrote, what the original reads in it): the run written in the 1.0.34
    layout, or written as a run store and converted (``smdebug convert --to 1.0.34``)."""
    work = tmp_path_factory.mktemp("ours_for_original")
    run_dir = work / "run"
    if request.param == "written":
        wrote = write_our_run(str(run_dir))
    else:
        from smdebug.storage.convert import convert

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SMDEBUG_LAYOUT", "store")
            wrote = write_our_run(str(work / "store_run"))
        assert os.path.isdir(work / "store_run" / "store")
        convert(str(work / "store_run"), str(run_dir), "1.0.34")
    dump = work / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=work)
    return str(run_dir), wrote, load_json(dump)


def _expected_for_original(name, value):
    """(dtype name, numbers) the original must report for a value we wrote."""
    arr = np.asarray(value)
    if arr.dtype.kind == "U":
        return "str", arr
    seen = ORIGINAL_SEES[arr.dtype.name]
    return seen, arr.astype(seen)


def _assert_same(got, want, what):
    assert got.shape == want.shape, f"{what}: the original read shape {got.shape}, we wrote {want.shape}"
    assert got.dtype == want.dtype, f"{what}: the original read dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind == "U":
        assert got.tolist() == want.tolist(), what
    else:
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (
            f"{what}: values differ\noriginal read: {got!r}\nwe wrote:      {want!r}")


def test_steps_modes_workers(our_run):
    _, wrote, got = our_run
    assert got["smdebug_version"] == "1.0.34"
    assert got["workers"] == list(WORKERS) and got["num_workers"] == 2
    assert got["loaded_all_steps"] is True
    saved = wrote["steps"]
    assert sorted(saved) == [0, 2, 4, 6, 7]  # the docs/format.md 1.1 example
    assert got["steps"]["GLOBAL"] == sorted(saved)
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
        want = sorted(s for m, s in saved.values() if m is mode)
        assert got["steps"][mode.name] == want, mode
        assert got["global_step"][mode.name] == {str(s): g for g, (m, s) in saved.items() if m is mode}
    assert got["steps_incomplete_too"] == got["steps"]
    assert got["modes"] == ["EVAL", "TRAIN"]
    assert got["mode_modestep"] == {str(g): [m.name, s] for g, (m, s) in saved.items()}


def test_tensor_names(our_run):
    _, wrote, got = our_run
    all_names = set()
    by_mode = {}
    for (g, _), written in wrote["values"].items():
        names = set(written)
        all_names |= names
        by_mode.setdefault(wrote["steps"][g][0].name, set()).update(names)
    assert got["tensor_names"]["GLOBAL"] == sorted(all_names)
    for mode_name, names in by_mode.items():
        assert got["tensor_names"][mode_name] == sorted(names), mode_name
    for g in wrote["steps"]:
        names = set(wrote["values"][(g, "worker_0")]) | set(wrote["values"][(g, "worker_1")])
        assert got["tensor_names_by_step"][str(g)] == sorted(names), g


def test_every_value_as_the_original_reads_it(our_run):
    _, wrote, got = our_run
    counted = 0
    for (g, worker), written in wrote["values"].items():
        for name, value in written.items():
            entry = got["tensors"][name]["at"][str(g)]
            assert worker in entry["workers"], (name, g, worker)
            item = entry["by_worker"][worker]
            what = f"{name} at step {g} ({worker})"
            if name == "shapes/act":
                assert item["value"]["error"] == "TensorUnavailableForStep", what
                assert item["shape"] == list(value.shape), what
                continue
            if name == "reduced_only/g":
                assert item["value"]["error"] == "TensorUnavailableForStep", what
                continue
            if name == "dtypes/uint64_big":
                # No dtype the original reads holds these numbers: DT_UINT64, which it cannot map.
                assert item["value"]["error"] == "KeyError", what
                continue
            dtype, numbers = _expected_for_original(name, value)
            _assert_same(decode_array(item["value"]), numbers, what)
            assert item["shape"] == list(np.shape(value)), what
            counted += 1
    assert counted > 200


def test_workers_of_each_tensor(our_run):
    _, wrote, got = our_run
    for g in wrote["steps"]:
        assert got["tensors"]["rank1_only/x"]["at"][str(g)]["workers"] == ["worker_1"]
        assert got["tensors"]["reduced/w"]["at"][str(g)]["workers"] == list(WORKERS)


def _numpy_reduction(value, op, is_abs):
    x = np.abs(value.astype(np.float64)) if is_abs else value.astype(np.float64)
    flat = x.reshape(-1)
    return {"min": np.min, "max": np.max, "mean": np.mean, "std": np.std, "variance": np.var, "sum": np.sum,
            "prod": np.prod, "l1": lambda v: np.sum(np.abs(v)), "l2": lambda v: math.sqrt(np.sum(v * v))}[op](flat)


def test_reductions_as_the_original_reads_them(our_run):
    run_dir, wrote, got = our_run
    ours = create_trial(run_dir)
    configs = {"reduced/w": REDUCED, "reduced_only/g": REDUCED_ONLY, "shapes/act": SHAPES}
    for (g, worker), written in wrote["values"].items():
        for name, config in configs.items():
            item = got["tensors"][name]["at"][str(g)]["by_worker"][worker]
            what = f"{name} at step {g} ({worker})"
            want_keys = {("abs_" if a else "") + op for op, a in config.all_reductions()}
            assert set(item["reductions"]) == want_keys, what
            our_saved = ours.tensor(name).reduction_values(g, worker=worker)
            for key, doc in item["reductions"].items():
                op, is_abs = (key[4:], True) if key.startswith("abs_") else (key, False)
                value = decode_array(doc)
                assert value.size == 1, what
                expected = _numpy_reduction(written[name], op, is_abs)
                assert np.isclose(float(value.reshape(-1)[0]), expected, rtol=1e-6, atol=1e-12), (what, key)
                # Bit for bit what our own reader reads.
                mine = np.asarray(our_saved[(op, is_abs)])
                assert value.dtype == mine.dtype and value.tobytes() == mine.tobytes(), (what, key)


def test_collections_as_the_original_reads_them(our_run):
    _, wrote, got = our_run
    colls = got["collections"]
    for name in ("dtypes", "misc", "reduced", "reduced_only", "shapes", "losses"):
        assert name in colls, name
    assert colls["reduced"]["reduction_config"]["save_raw_tensor"] is True
    assert colls["reduced"]["reduction_config"]["reductions"] == (
        "min,max,mean,std,variance,sum,prod,l1_norm,l2_norm,"
        "abs_min,abs_max,abs_mean,abs_std,abs_variance,abs_sum,abs_prod,abs_l1_norm,abs_l2_norm")
    assert colls["reduced_only"]["reduction_config"] == {
        "save_raw_tensor": False, "reductions": "min,max,mean,l2_norm,abs_max,abs_l1_norm", "save_shape": False}
    assert colls["shapes"]["reduction_config"]["save_shape"] is True
    for mode in ("TRAIN", "EVAL", "PREDICT", "GLOBAL"):
        assert colls["reduced"]["save_config"][mode]["save_interval"] == SAVE_INTERVAL, mode
    assert got["collection_tensor_names"]["reduced"] == ["reduced/w"]
    assert "misc/text" in got["collection_tensor_names"]["misc"]
    assert got["collection_tensor_names"]["losses"] == ["losses/loss"]


def test_event_files_pass_the_originals_record_check(our_run):
    """The original's EventFileReader, with its default "minimal" check (length CRC and magic
    payload footer), reads every record of every file, in index order, with our mode metadata."""
    run_dir, wrote, got = our_run
    files = got["event_files"]
    assert set(files) == {layout.event_file_relpath(g, w) for (g, w) in wrote["values"]}
    for rel, read in files.items():
        assert "error" not in read, f"the original's EventFileReader rejects {rel}: {read}"
        step, worker = layout.parse_step_and_worker(rel)
        mode, mode_step = wrote["steps"][step]
        index = load_json(os.path.join(run_dir, layout.index_file_relpath(step, worker)))
        assert [r[0] for r in read["records"]] == [e["tensorname"] for e in index["tensor_payload"]], rel
        for tag, record_step, mode_name, record_mode_step, problem in read["records"]:
            assert (record_step, mode_name, record_mode_step) == (step, mode.name, mode_step), (rel, tag)
            if tag == "dtypes/uint64_big":
                assert problem["error"] == "KeyError", (rel, tag)  # DT_UINT64: see the module docstring
            else:
                assert problem is None, (rel, tag, problem)


# ---------------------------------------------------------------------------------------------
# Edge cases, in a second run: PREDICT and GLOBAL modes, empty tensors, bytes, N-D strings,
# 8-bit floats. Kept apart so that one of them failing cannot hide the results above.

EDGE_PHASES = ((ModeKeys.PREDICT, 2), (ModeKeys.GLOBAL, 2), (ModeKeys.TRAIN, 1))


def _edge_values(g):
    return {
        "edge/empty": np.zeros((0, 3), dtype=np.float32),
        "edge/bytes": np.array([b"ab", b"step %d" % g]),
        "edge/text_2d": np.array([["a", "b", "c"], ["d", "e", f"step {g}"]]),
        "edge/float8": np.array([0.5, -2.0, 448.0, g], dtype=ml_dtypes.float8_e4m3fn),
        "edge/uint64_small": np.array([0, 2**63 - 1, g], dtype=np.uint64),
    }


@pytest.fixture(scope="module")
def edge_run(original_python, tmp_path_factory):
    """(what we wrote: {g: (mode, mode_step, values)}, what the original reads)."""
    work = tmp_path_factory.mktemp("edge_for_original")
    run_dir = work / "run"
    hook = smd.Hook(out_dir=str(run_dir), save_config=smd.SaveConfig(save_interval=1))
    wrote = {}
    for mode, count in EDGE_PHASES:
        hook.set_mode(mode)
        for _ in range(count):
            assert hook.begin_step()
            values = _edge_values(hook.global_step)
            for name, value in values.items():
                hook.save_tensor(name, value, "edge")
            wrote[hook.global_step] = (mode, hook.mode_step, values)
    hook.close()
    dump = work / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=work)
    return wrote, load_json(dump)


def _edge_item(got, name, g):
    return got["tensors"][name]["at"][str(g)]["by_worker"]["worker_0"]


def test_edge_predict_and_global_modes(edge_run):
    wrote, got = edge_run
    assert got["steps"]["GLOBAL"] == sorted(wrote) == [0, 1, 2, 3, 4]
    assert got["steps"]["PREDICT"] == [0, 1]
    assert got["steps"]["TRAIN"] == [0]
    assert got["modes"] == ["PREDICT", "TRAIN"]  # the original never lists GLOBAL
    # GLOBAL-mode steps carry mode_step == global step (docs/format.md 1.5).
    assert got["mode_modestep"] == {str(g): [m.name, s] for g, (m, s, _) in wrote.items()}
    assert got["mode_modestep"]["2"] == ["GLOBAL", 2] and got["mode_modestep"]["3"] == ["GLOBAL", 3]


def test_edge_empty_tensor_is_a_shape(edge_run):
    wrote, got = edge_run
    for g in wrote:
        item = _edge_item(got, "edge/empty", g)
        assert item["value"]["error"] == "TensorUnavailableForStep", g
        assert item["shape"] == [0, 3], g


def test_edge_bytes_read_as_text(edge_run):
    """Our bytes arrays go out as string_val (marker "bytes"); the original decodes them as UTF-8 text."""
    wrote, got = edge_run
    for g, (_, _, values) in wrote.items():
        value = decode_array(_edge_item(got, "edge/bytes", g)["value"])
        assert value.tolist() == [b.decode() for b in values["edge/bytes"].tolist()], g


def test_edge_float8_and_small_uint64_read_widened(edge_run):
    wrote, got = edge_run
    for g, (_, _, values) in wrote.items():
        _assert_same(decode_array(_edge_item(got, "edge/float8", g)["value"]),
                     values["edge/float8"].astype(np.float32), f"edge/float8 at {g}")
        _assert_same(decode_array(_edge_item(got, "edge/uint64_small", g)["value"]),
                     values["edge/uint64_small"].astype(np.int64), f"edge/uint64_small at {g}")


def test_edge_multidimensional_strings_readable_by_the_original(edge_run):
    """The original reads only 1-D string tensors (docs/format.md 2.3).

    A 2-D str array must still reach it as the same strings: expected here in C order as
    a 1-D array (our reader can restore the shape from a marker, as it does for widened
    dtypes).
    """
    wrote, got = edge_run
    for g, (_, _, values) in wrote.items():
        item = _edge_item(got, "edge/text_2d", g)
        assert "error" not in item["value"], (
            f"the original cannot read our 2-D string tensor at step {g}: {item['value']}")
        assert decode_array(item["value"]).tolist() == values["edge/text_2d"].reshape(-1).tolist(), g


def test_median_reduction_does_not_break_the_original(original_python, tmp_path):
    """Our ReductionConfig also accepts "median", which the original's does not.

    The original rebuilds every collection's ReductionConfig from the collections file when
    it opens a trial, so "median" in a ``reductions`` string there makes its create_trial
    raise SMDebugValueError: the whole run becomes unreadable. The median *record* itself
    (``smdebug/reductions/median/<name>``) is fine for the original.
    """
    run_dir = tmp_path / "run"
    value = np.array([[3.0, 1.0, 2.0], [9.0, -4.0, 5.5]])
    hook = smd.Hook(out_dir=str(run_dir), save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("stats").reduction_config = smd.ReductionConfig(
        reductions=["median", "mean"], abs_reductions=["median"], save_raw_tensor=True)
    hook.begin_step()
    hook.save_tensor("stats/x", value, "stats")
    hook.close()
    dump = tmp_path / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=tmp_path)
    got = load_json(dump)
    item = got["tensors"]["stats/x"]["at"]["0"]["by_worker"]["worker_0"]
    _assert_same(decode_array(item["value"]), value, "stats/x")
    reductions = {k: float(decode_array(v).reshape(-1)[0]) for k, v in item["reductions"].items()}
    assert reductions == {"median": np.median(value), "mean": np.mean(value), "abs_median": np.median(np.abs(value))}


def test_original_reads_a_step_that_a_late_scalar_joined(original_python, tmp_path):
    """A scalar saved after the last step ended is appended to that step's published event
    file and its index replaced: the original reads both the step's records and the scalar."""
    run_dir = tmp_path / "run"
    hook = smd.Hook(out_dir=str(run_dir), save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    hook.save_tensor("w", np.arange(3.0), "weights")
    hook.end_step()
    assert hook.flush(timeout=30)  # the step is published
    hook.save_scalar("final", 0.25)  # after the last step: it joins step 0
    hook.close()
    dump = tmp_path / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=tmp_path)
    got = load_json(dump)
    assert sorted(got["tensors"]) == ["scalar/final", "w"]
    final = got["tensors"]["scalar/final"]["at"]["0"]["by_worker"]["worker_0"]
    _assert_same(decode_array(final["value"]), np.array([0.25]), "scalar/final")
    w = got["tensors"]["w"]["at"]["0"]["by_worker"]["worker_0"]
    _assert_same(decode_array(w["value"]), np.arange(3.0), "w")


def test_health_reductions_leave_the_rest_of_the_run_readable_by_the_original(original_python, tmp_path):
    """The health reductions (nonfinite, zero_fraction, kurtosis, overflow_*, underflow_*) are
    ours: the collections file lists them under ``extra_reductions``, which 1.0.34 ignores,
    so it still reads every other tensor and reduction of the run, and their records too."""
    from smdebug import reductions as reference

    run_dir = tmp_path / "run"
    health = list(reference.HEALTH_REDUCTIONS)
    weight = np.array([[0.0, 1e-9, 500.0], [70000.0, -2.0, np.nan]], dtype=np.float32)
    plain = np.array([3.0, -1.0, 2.0])
    hook = smd.Hook(out_dir=str(run_dir), save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("health").reduction_config = smd.ReductionConfig(
        reductions=health + ["max"], abs_reductions=["kurtosis"], save_raw_tensor=True)
    hook.get_collection("plain").reduction_config = smd.ReductionConfig(reductions=["min", "mean"], norms=["l2"],
                                                                        save_raw_tensor=True)
    hook.begin_step()
    hook.save_tensor("health/w", weight, "health")
    hook.save_tensor("plain/x", plain, "plain")
    hook.close()
    dump = tmp_path / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=tmp_path)
    got = load_json(dump)
    item = got["tensors"]["plain/x"]["at"]["0"]["by_worker"]["worker_0"]
    _assert_same(decode_array(item["value"]), plain, "plain/x")
    reductions = {k: float(decode_array(v).reshape(-1)[0]) for k, v in item["reductions"].items()}
    assert reductions == {"min": -1.0, "mean": plain.mean(), "l2": float(np.linalg.norm(plain))}
    item = got["tensors"]["health/w"]["at"]["0"]["by_worker"]["worker_0"]
    _assert_same(decode_array(item["value"]), weight, "health/w")
    reductions = {k: float(decode_array(v).reshape(-1)[0]) for k, v in item["reductions"].items()}
    want = {op: float(reference.reduce(weight, op)) for op in health + ["max"]}
    want["abs_kurtosis"] = float(reference.reduce(weight, "kurtosis", True))
    assert reductions.keys() == want.keys()
    np.testing.assert_allclose([reductions[k] for k in want], list(want.values()), rtol=1e-12, equal_nan=True)

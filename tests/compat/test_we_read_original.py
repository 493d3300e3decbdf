"""Our reader on a run written by the ORIGINAL smdebug 1.0.34's PyTorch hook.

original_torch_run.py (run by the original's interpreter) trains a tiny torch model with
``smdebug.pytorch.Hook`` and dumps what the original's own ``create_trial`` reads. Here our
``create_trial`` opens the same run and must report the same steps, modes, workers, tensor
names, collections, values (bit for bit, same dtype), shapes and saved reductions.

One deliberate difference: when the original hook writes a shape entry next to a raw
value (a collection with save_raw_tensor and save_shape), the original's reader loses the
value (docs/format.md 3.2); ours returns it.
"""
import os
import sys

import numpy as np
import pytest

from compat_json import decode_array
from compat_runner import load_json, run_original
from smdebug.exceptions import TensorUnavailableForStep
from smdebug.storage.format.codec import decode_tensor_event
from smdebug.storage.format.records import iter_records
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial

MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)


@pytest.fixture(scope="module")
def original_run(original_python, tmp_path_factory):
    """(run directory written by the original torch hook, what the original reads in it)."""
    work = tmp_path_factory.mktemp("original_torch")
    run_dir, dump = work / "run", work / "original_reads.json"
    run_original(original_python, "original_torch_run.py", run_dir, dump, cwd=work)
    return str(run_dir), load_json(dump)


@pytest.fixture(scope="module")
def trial(original_run):
    return create_trial(original_run[0])


def _same_array(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, the original read {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, the original read {want.shape}"
    if got.dtype.kind == "U":
        assert got.tolist() == want.tolist(), what
    else:
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (
            f"{what}: values differ\nours:     {got!r}\noriginal: {want!r}")


def test_run_is_what_the_scenario_wrote(original_run):
    """Guards the scenario itself, so the comparisons below compare something."""
    _, want = original_run
    assert want["smdebug_version"] == "1.0.34"
    assert want["steps"]["TRAIN"] and want["steps"]["EVAL"]
    assert any(k.startswith("gradient/") for k in want["tensors"])
    kinds = set()
    for entry in want["tensors"].values():
        for at in entry["at"].values():
            for item in at["by_worker"].values():
                if "error" not in item["value"]:
                    kinds.add("raw")
                if item["reductions"] and "error" not in item["reductions"]:
                    kinds.add("reductions")
                if "error" in item["value"] and "error" not in item["shape"]:
                    kinds.add("shape only")
    assert kinds == {"raw", "reductions", "shape only"}
    for rel, read in want["event_files"].items():
        assert "error" not in read, f"the original cannot read its own {rel}: {read}"


def test_steps_modes_and_workers(trial, original_run):
    _, want = original_run
    for mode in MODES:
        assert trial.steps(mode=mode) == want["steps"][mode.name], mode
        assert trial.steps(mode=mode, show_incomplete_steps=True) == want["steps_incomplete_too"][mode.name], mode
    assert sorted(m.name for m in trial.modes()) == want["modes"]
    for g, (mode_name, mode_step) in want["mode_modestep"].items():
        assert trial.mode_modestep(int(g)) == (ModeKeys[mode_name], mode_step)
        assert trial.mode(int(g)) == ModeKeys[mode_name]
        assert trial.mode_step(int(g)) == mode_step
    for mode_name, mapping in want["global_step"].items():
        for s, g in mapping.items():
            assert trial.global_step(ModeKeys[mode_name], int(s)) == g
    assert trial.workers() == want["workers"]
    assert trial.num_workers == want["num_workers"]
    assert trial.loaded_all_steps is True and want["loaded_all_steps"] is True


def test_tensor_names(trial, original_run):
    _, want = original_run
    for mode in MODES:
        expected = want["tensor_names"][mode.name]
        if isinstance(expected, dict):  # the original raises KeyError for a mode it never saw
            assert mode.name not in want["modes"] and mode is not ModeKeys.GLOBAL, expected
            assert trial.tensor_names(mode=mode) == []
        else:
            assert trial.tensor_names(mode=mode) == expected, mode
    for g, names in want["tensor_names_by_step"].items():
        assert trial.tensor_names(step=int(g)) == names, f"step {g}"


def test_collections(trial, original_run):
    _, want = original_run
    ours = trial.collections()
    assert sorted(ours) == sorted(want["collections"])
    for name, doc in want["collections"].items():
        got = ours[name].to_json_dict()
        assert got["include_regex"] == doc["include_regex"], name
        assert sorted(got["tensor_names"]) == sorted(doc["tensor_names"]), name
        assert got["reduction_config"] == doc["reduction_config"], name
        assert got["save_config"] == doc["save_config"], name
        assert got["save_histogram"] == doc["save_histogram"], name
        assert trial.tensor_names(collection=name) == want["collection_tensor_names"][name], name


def _raw_and_shape_collection(trial, tensor_name):
    """Whether the tensor is in a collection saving both its value and its shape (docs/format.md 3.2)."""
    return any(
        c.matches(tensor_name) and c.reduction_config is not None
        and c.reduction_config.save_raw_tensor and c.reduction_config.save_shape
        for c in trial.collections().values()
    )


def test_every_value_shape_and_reduction(trial, original_run):
    _, want = original_run
    assert trial.tensor_names() == sorted(want["tensors"])
    checked = {"values": 0, "reductions": 0, "shape only": 0, "value the original lost": 0}
    for name, entry in want["tensors"].items():
        tensor = trial.tensor(name)
        for mode in MODES:
            assert tensor.steps(mode=mode) == entry["steps"][mode.name], (name, mode)
        for g, at in entry["at"].items():
            g = int(g)
            assert tensor.workers(g) == at["workers"], (name, g)
            for worker, item in at["by_worker"].items():
                what = f"{name} at step {g} ({worker})"
                mode, mode_step = trial.mode_modestep(g)
                # Shapes as the original reads them: one number of a scalar collection stored
                # as a (1,) vector comes back (1,) here too.
                assert tuple(item["shape"]) == tensor.shape(g, worker=worker), what
                if "error" not in item["value"]:
                    expected = decode_array(item["value"])
                    _same_array(tensor.value(g, worker=worker), expected, what)
                    _same_array(tensor.value(mode_step, mode=mode, worker=worker), expected, what + " by mode step")
                    checked["values"] += 1
                elif _raw_and_shape_collection(trial, name):
                    # The original's reader drops a value saved next to a shape; ours keeps it.
                    assert item["value"]["error"] == "TensorUnavailableForStep", what
                    assert tensor.value(g, worker=worker).shape == tuple(item["shape"]), what
                    checked["value the original lost"] += 1
                else:
                    assert item["value"]["error"] == "TensorUnavailableForStep", what
                    with pytest.raises(TensorUnavailableForStep):
                        tensor.value(g, worker=worker)
                    checked["shape only"] += 1
                want_reductions = {k: decode_array(v) for k, v in item["reductions"].items()}
                got_reductions = {("abs_" if is_abs else "") + op: v
                                  for (op, is_abs), v in tensor.reduction_values(g, worker=worker).items()}
                assert sorted(got_reductions) == sorted(want_reductions), what
                for key, value in want_reductions.items():
                    _same_array(got_reductions[key], value, f"{key} of {what}")
                    op, is_abs = (key[4:], True) if key.startswith("abs_") else (key, False)
                    _same_array(np.asarray(tensor.reduction_value(g, op, worker=worker, abs=is_abs)), value,
                                f"reduction_value {key} of {what}")
                    checked["reductions"] += 1
    assert all(checked.values()), checked


def test_event_files_read_whole_like_the_original_filereader(trial, original_run):
    """Our low-level record reader and decoder agree with the original's, record by record."""
    run_dir, want = original_run
    assert want["event_files"], "the original wrote no event files"
    for rel, read in want["event_files"].items():
        assert "error" not in read, rel
        with open(os.path.join(run_dir, rel), "rb") as fh:
            data = fh.read()
        ours = []
        for payload in iter_records(data, check="minimal"):
            decoded = decode_tensor_event(payload, rel)
            ours.append([decoded.tag, decoded.global_step, decoded.mode.name, decoded.mode_step])
        assert ours == [record[:4] for record in read["records"]], rel


def test_scalar_flushed_after_set_mode(trial, original_run):
    """The original's save_scalar record can carry a stale mode and mode step -1 in its own metadata.

    Its hook writes a cached scalar when the step's writer closes, stamping it with the mode
    and mode step current *then*: here the TRAIN step 4 file (global 4) holds ``scalar/lr``
    records that say EVAL, -1, because set_mode(EVAL) came before the flush. The index's meta
    (TRAIN, 4) is what counts (docs/format.md 1.5); the original's Trial reads the value fine.
    """
    run_dir, want = original_run
    records = want["event_files"]["events/000000000004/000000000004_worker_0.tfevents"]["records"]
    stale = [r for r in records if r[0] == "scalar/lr"]
    assert stale and all(r[2:4] == ["EVAL", -1] for r in stale), stale  # the quirk is really there
    assert trial.mode_modestep(4) == (ModeKeys.TRAIN, 4)
    expected = decode_array(want["tensors"]["scalar/lr"]["at"]["4"]["by_worker"]["worker_0"]["value"])
    assert expected.shape == (1,)  # save_scalar values: stored and read as (1,), by the original and by us
    _same_array(trial.tensor("scalar/lr").value(4), expected, "scalar/lr at step 4")
    _same_array(trial.tensor("scalar/lr").value(4, mode=ModeKeys.TRAIN), expected, "scalar/lr at TRAIN step 4")


def test_dataframe_of_a_run_the_original_wrote(trial):
    """Trial.to_dataframe on the original's files: every row equals value()/reduction_value()."""
    pytest.importorskip("pandas")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
    from check_rows import assert_rows_equal_value_api

    df = trial.to_dataframe()
    assert len(df) and "" in set(df["reduction"]) and len(set(df["reduction"])) > 1
    assert assert_rows_equal_value_api(trial, df) == len(df)
    # The original's records follow the same layout: the bulk walk reads most of them.
    assert trial.stats["table_records_bulk"] > len(df) // 2, trial.stats

"""Sharded parameters (FSDP2 / DTensor): exact reductions from shards, a fixed number of
collectives per saved step, full tensors reassembled, HSDP meshes not double-counted.

Real processes: ``fsdp2_train.py`` trains FSDP2 models on CPU with gloo (2 processes, and 4
for a 2x2 HSDP mesh) and writes, next to each run, what ``full_tensor()`` gave.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
pytest.importorskip("torch.distributed.fsdp")

from smdebug import reductions as ref  # noqa: E402
from smdebug.pytorch.sharded import (PARTIAL_COLUMNS, combine_partials, reductions_from_partials,  # noqa: E402
                                     shard_partials)
from smdebug.pytorch.backend import TorchBackend  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp2_train.py")
BACKEND = TorchBackend()
ALL_KEYS = [(op, a) for op in ("min", "max", "mean", "std", "variance", "sum", "l1", "l2") for a in (False, True)]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(base, world, scenarios):
    done = subprocess.run([sys.executable, SCRIPT, str(base), str(free_port()), str(world), ",".join(scenarios)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    (base / "stderr.txt").write_text(done.stderr)
    return base


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("fsdp2"), 2,
                  ["reductions", "wide", "full_one", "full_all", "hsdp", "fsdp1", "fsdp1_full_all", "fsdp1_flat",
                   "inplace", "tp", "tp_full_all", "flight", "health", "updates", "updates_full_one",
                   "updates_full_all", "updates_only", "updates_skipped", "fsdp1_updates", "hsdp_updates",
                   "tp_updates"])


@pytest.fixture(scope="module")
def runs_4(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("fsdp2_4"), 4, ["hsdp", "hsdp_full_one", "hsdp_full_all", "hsdp_updates"])


def assert_reductions_equal_full_tensor(run_dir, saved=lambda name: True):
    """Every reduction of every weight and gradient (and update and optimizer state, where the
    run saved them) at every step, against full_tensor(); ``saved``: the reference's names the
    run saves."""
    trial = create_trial(run_dir)
    with open(os.path.join(run_dir, "reference_0.json")) as f:
        reference = [{name: values for name, values in by_name.items() if saved(name)}
                     for by_name in json.load(f)]
    assert trial.steps() == list(range(len(reference)))
    assert all(len(names) for names in reference)
    checked = 0
    for step, by_name in enumerate(reference):
        assert sorted(by_name) == sorted(trial.tensor_names(step=step))
        for name, expected in by_name.items():
            for reduction, value in expected.items():
                is_abs = reduction.startswith("abs_")
                got = trial.tensor(name).reduction_value(step, reduction[4:] if is_abs else reduction, abs=is_abs)
                np.testing.assert_allclose(got, value, rtol=1e-6, atol=0, err_msg=f"{name} {reduction} step {step}")
                checked += 1
    return checked


def test_names_are_the_unsharded_names(runs):
    names = create_trial(runs / "reductions").tensor_names()
    assert names == ["Sequential_0.bias", "Sequential_0.weight", "Sequential_2.bias", "Sequential_2.weight",
                     "gradient/Sequential_0.bias", "gradient/Sequential_0.weight", "gradient/Sequential_2.bias",
                     "gradient/Sequential_2.weight"]  # no FSDPSequential prefix


def test_every_reduction_of_every_weight_and_gradient_is_that_of_the_full_tensor(runs):
    # Uneven shards: 3 rows over 2 ranks, and a 1-row weight of which one rank holds nothing.
    # 3 TRAIN steps (weights, gradients), then an EVAL step (weights, captured at its forward)
    assert assert_reductions_equal_full_tensor(runs / "reductions") == 3 * 8 * 16 + 4 * 16
    assert create_trial(runs / "reductions").mode(3).name == "EVAL"


def test_health_reductions_of_sharded_parameters_are_those_of_the_full_tensor(runs):
    """nonfinite, zero_fraction, kurtosis, overflow_/underflow_ (and abs_) from per-shard counts
    and moment sums, one rank holding an empty piece of the 1-row weight; still one collective
    per saved step."""
    n = len(ref.HEALTH_REDUCTIONS) * 2
    # weights, gradients, updates and momentum buffers of the 4 parameters
    assert assert_reductions_equal_full_tensor(runs / "health") == 3 * 16 * n
    trial = create_trial(runs / "health")
    assert trial.tensor("Sequential_0.weight").reduction_value(0, "overflow_fp16") == pytest.approx(1 / 15)
    assert trial.tensor("Sequential_0.weight").reduction_value(0, "underflow_bf16") == pytest.approx(1 / 14)
    for rank in (0, 1):
        with open(runs / "health" / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == [1, 1, 1]
    assert "optimizer/Sequential_2.weight/momentum_buffer" in trial.tensor_names()


def test_updates_and_optimizer_state_of_sharded_parameters_are_those_of_the_full_tensors(runs):
    """update/<w> (after optimizer.step() minus before, from each rank's piece) and Adam's
    exp_avg, exp_avg_sq (sharded as their parameter) and step (a plain scalar) equal the
    reductions of the full tensors around each step; one rank holds an empty piece of the
    1-row weight; the weights, gradients, updates and state of a step share its one collective."""
    trial = create_trial(runs / "updates")
    names = trial.tensor_names(step=0)
    assert [n for n in names if n.startswith("optimizer/Sequential_2.weight/")] == [
        "optimizer/Sequential_2.weight/exp_avg", "optimizer/Sequential_2.weight/exp_avg_sq",
        "optimizer/Sequential_2.weight/step"]
    assert len([n for n in names if n.startswith("update/")]) == 4
    assert assert_reductions_equal_full_tensor(runs / "updates") == 3 * (4 * 3 + 4 * 3) * 16
    for rank in (0, 1):
        with open(runs / "updates" / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == [1, 1, 1]
    stderr = (runs / "stderr.txt").read_text()
    assert "are not saved from step" not in stderr  # no collective lost
    assert not [line for line in stderr.splitlines() if " is not saved: " in line and "/Sequential" in line]


@pytest.mark.parametrize("scenario, tensors, collectives", [
    ("hsdp_updates", 4, [0, 0, 0]),  # a 2x1 mesh: shard groups of one rank exchange nothing
    ("tp_updates", 1, [1, 1, 1]),  # a DTensor sharded along its columns, no FSDP
])
def test_updates_and_optimizer_state_on_other_meshes(runs, scenario, tensors, collectives):
    assert assert_reductions_equal_full_tensor(runs / scenario) == 3 * tensors * 6 * 16
    with open(runs / scenario / "collectives_0.json") as f:
        assert json.load(f)["per_step"] == collectives


def test_hsdp_2x2_updates_and_optimizer_state_count_each_element_once(runs_4):
    """State and updates under HSDP (replicate x shard) are combined over the shard dimension
    only, as the weights: a replica counted twice would double sums, norms and counts."""
    assert assert_reductions_equal_full_tensor(runs_4 / "hsdp_updates") == 3 * 4 * 6 * 16
    for rank in range(4):
        with open(runs_4 / "hsdp_updates" / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == [1, 1, 1]


def test_updates_alone_of_sharded_parameters(runs):
    """The updates collection without the weights and gradients: their one collective moves
    after the optimizer step and carries the updates only."""
    assert assert_reductions_equal_full_tensor(
        runs / "updates_only", lambda name: name.startswith("update/")) == 3 * 4 * 16
    with open(runs / "updates_only" / "collectives_0.json") as f:
        assert json.load(f)["per_step"] == [1, 1, 1]


def test_a_step_whose_optimizer_step_is_skipped_saves_weights_and_gradients(runs):
    """A trainer's gradient scaler skips optimizer.step() after capture_parameters (an overflow):
    the step's exchange runs at its end with the weights and gradients alone, on every rank."""
    trial = create_trial(runs / "updates_skipped")
    assert trial.steps() == [0, 1, 2]
    for step in (0, 1, 2):
        names = trial.tensor_names(step=step)
        assert "Sequential_2.weight" in names and "gradient/Sequential_2.weight" in names
        has_changes = any(n.startswith(("update/", "optimizer/")) for n in names)
        assert has_changes == (step != 1), (step, names)
    for rank in (0, 1):
        with open(runs / "updates_skipped" / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == [1, 1, 1]
    np.testing.assert_allclose(trial.tensor("optimizer/Sequential_0.weight/step").reduction_value(2, "max"), 2.0)


def test_fsdp1_updates_are_those_of_the_full_tensor_and_its_optimizer_state_is_refused_once(runs):
    """FSDP (v1) flat pieces: updates exact; optimizer state not saved (a rank that holds none
    of a parameter keeps no state for it: the ranks would not agree on what to exchange)."""
    assert assert_reductions_equal_full_tensor(
        runs / "fsdp1_updates", lambda name: not name.startswith("optimizer/")) == 3 * 12 * 16
    assert not create_trial(runs / "fsdp1_updates").tensor_names(collection="optimizer_variables")
    assert (runs / "stderr.txt").read_text().count("optimizer state of FSDP (v1) parameters is not saved") == 2  # once per rank


@pytest.mark.parametrize("workers", ["one", "all"])
def test_full_updates_and_optimizer_state_of_sharded_parameters_are_reassembled(runs, workers):
    """save_raw_tensor: as for the weights, the chief gathers the pieces of the updates and
    state (one all_gather and one gather per saved step) and writes the full tensors, or each
    worker writes its pieces and the Trial reassembles them."""
    run_dir = runs / f"updates_full_{workers}"
    trial = create_trial(run_dir)
    full = np.load(run_dir / "full_0.npz")
    assert len(full.files) == 3 * (8 + 4 + 4 * 3)
    for key in full.files:
        step, name = key.split("|")
        np.testing.assert_array_equal(trial.tensor(name).value(int(step)).astype(np.float64), full[key],
                                      err_msg=key)
    assert trial.workers() == (["worker_0"] if workers == "one" else ["worker_0", "worker_1"])
    for rank in (0, 1):
        with open(run_dir / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == ([2, 2, 2] if workers == "one" else [1, 1, 1])


def test_weights_changed_in_place_after_the_forward_are_saved_as_the_optimizer_sees_them(runs):
    """The weights' partials start at the forward; a change in place before optimizer.step()
    (not the optimizer's) makes them read again: the saved values are those just before the step."""
    assert assert_reductions_equal_full_tensor(runs / "inplace") == 3 * 8 * 16


def test_dtensor_parameter_sharded_along_columns_without_fsdp(runs):
    """Any DTensor parameter (tensor parallelism's Shard(1) here): exact reductions, and full
    tensors reassembled from blocks of columns (4 + 3)."""
    assert assert_reductions_equal_full_tensor(runs / "tp") == 3 * 2 * 16
    trial = assert_full_tensors(runs / "tp_full_all", tensors=2)
    assert trial.tensor("Sequential_0.weight").value(0, worker="worker_1").shape == (5, 3)


def test_a_reduction_that_cannot_be_exact_is_refused_with_one_warning(runs):
    stderr = (runs / "stderr.txt").read_text()
    warning = "median cannot be computed exactly from the shards of sharded parameters"
    assert stderr.count(warning) == 2  # once per rank (the "reductions" scenario asks for it)
    trial = create_trial(runs / "reductions")
    with pytest.raises(Exception, match="median"):
        trial.tensor("Sequential_0.weight").reduction_value(0, "median")


def test_collectives_per_saved_step_do_not_grow_with_the_parameters(runs):
    counts = {}
    for scenario in ("reductions", "wide"):
        for rank in (0, 1):
            with open(runs / scenario / f"collectives_{rank}.json") as f:
                info = json.load(f)
            counts[(scenario, rank)] = info
    assert counts[("reductions", 0)]["parameters"] == 4 and counts[("wide", 0)]["parameters"] == 40
    assert {tuple(c["per_step"]) for c in counts.values()} == {(1, 1, 1)}  # one all_gather per saved step
    assert assert_reductions_equal_full_tensor(runs / "wide") == 3 * 80 * 16


def assert_full_tensors(run_dir, tensors=8):
    trial = create_trial(run_dir)
    full = np.load(run_dir / "full_0.npz")
    assert len(full.files) == 3 * tensors
    for key in full.files:
        step, name = key.split("|")
        np.testing.assert_array_equal(trial.tensor(name).value(int(step)).astype(np.float64), full[key])
    return trial


@pytest.mark.parametrize("scenario", ["full_one", "full_all", "fsdp1_full_all"])
def test_full_tensors_reassembled_by_the_trial_equal_full_tensor(runs, scenario):
    trial = create_trial(runs / scenario)
    full = np.load(runs / scenario / "full_0.npz")
    assert len(full.files) == 3 * 8
    for key in full.files:
        step, name = key.split("|")
        tensor = trial.tensor(name)
        value = tensor.value(int(step))
        assert value.shape == full[key].shape
        np.testing.assert_array_equal(value.astype(np.float64), full[key])
        assert tensor.shape(int(step)) == full[key].shape
        np.testing.assert_allclose(tensor.reduction_value(int(step), "variance"), full[key].var(), rtol=1e-6)
    every_step = trial.tensor("Sequential_0.weight").values()  # whole tensors too
    assert [v.shape for v in every_step.values()] == [(3, 5)] * 3
    if scenario == "full_one":
        assert trial.workers() == ["worker_0"]  # the chief gathered and wrote the full tensors
    elif scenario == "full_all":
        assert trial.workers() == ["worker_0", "worker_1"]
        # each worker's own piece: rows 0-1 on worker_0, row 2 on worker_1
        piece = trial.tensor("Sequential_0.weight").value(0, worker="worker_1")
        np.testing.assert_array_equal(piece.astype(np.float64), full["0|Sequential_0.weight"][2:])


def test_full_tensor_pieces_carry_their_placement_in_the_run_store(runs):
    """Each piece is a record of its worker's chunk whose tensors row holds its placement
    (docs/format.md 10.3); a piece of one element stays a record too."""
    from smdebug.storage import store_rows

    _, tensors = store_rows.local_segments(str(runs / "full_all"), "worker_1").all_rows()
    rows = [r for r in tensors.to_pylist() if r["step"] == 0]
    by_name = {r["tensor"]: r for r in rows}
    assert json.loads(by_name["Sequential_0.weight"]["placement"]) == {
        "global_shape": [3, 5], "local_shape": [1, 5], "offsets": [2, 0]}
    assert by_name["Sequential_0.bias"]["shape"] == [1] and by_name["Sequential_0.bias"]["placement"]
    assert [r["tensor"] for r in rows][:2] == ["Sequential_0.weight", "Sequential_0.bias"]


def test_fsdp1_use_orig_params_reductions_are_those_of_the_full_tensor(runs):
    """FSDP (v1) with use_orig_params=True: each rank holds a flat range of one flattened
    parameter (0.weight is split across both ranks; the others lie on one rank)."""
    assert create_trial(runs / "fsdp1").tensor_names()[0] == "Sequential_0.bias"  # no _fsdp_wrapped_module
    assert assert_reductions_equal_full_tensor(runs / "fsdp1") == 3 * 8 * 16


def test_fsdp1_without_use_orig_params_says_so_once_and_trains_on(runs):
    stderr = (runs / "stderr.txt").read_text()
    assert stderr.count("wrapped in FSDP (v1) without use_orig_params=True") == 2  # once per rank
    assert not (runs / "fsdp1_flat" / "index").exists()  # no FlatParameter saved under a made-up name
    with open(runs / "fsdp1_flat" / "collectives_0.json") as f:
        assert json.load(f)["per_step"] == [0, 0, 0]


def test_hsdp_replicated_dimension_is_not_counted(runs):
    """A 2x1 (replicate x shard) mesh on 2 processes: a reduction gathered over the replicate
    dimension would count every element twice (sums, norms and counts would be off)."""
    assert assert_reductions_equal_full_tensor(runs / "hsdp") == 3 * 8 * 16
    with open(runs / "hsdp" / "collectives_0.json") as f:
        assert json.load(f)["per_step"] == [0, 0, 0]  # shard groups of one rank exchange nothing


def test_hsdp_2x2_mesh_on_4_processes(runs_4):
    assert assert_reductions_equal_full_tensor(runs_4 / "hsdp") == 3 * 8 * 16
    with open(runs_4 / "hsdp" / "collectives_0.json") as f:
        assert json.load(f)["per_step"] == [1, 1, 1]
    # Full tensors: the chief gathers over its shard group only (the other replica sends nothing) ...
    assert assert_full_tensors(runs_4 / "hsdp_full_one").workers() == ["worker_0"]
    for rank, expected in ((0, [2, 2, 2]), (2, [1, 1, 1])):  # all_gather (+ gather where the chief is)
        with open(runs_4 / "hsdp_full_one" / f"collectives_{rank}.json") as f:
            assert json.load(f)["per_step"] == expected
    # ... or every rank saves its piece, and the Trial reads one replica's of each block.
    assert len(assert_full_tensors(runs_4 / "hsdp_full_all").workers()) == 4


# ----------------------------------------------------------------- the combination, in one process
@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_partials_combine_to_the_full_tensors_reductions(offset):
    """Shards of uneven sizes (one empty), a large common offset (where E[x^2] - mean^2
    would cancel: Chan's combination does not), float32 and float64."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        full = (torch.randn(7, 5, generator=gen, dtype=torch.float64) * 1e-3 + offset).to(dtype)
        pieces = [full[:4], full[4:4], full[4:6], full[6:]]
        gathered = np.stack([shard_partials([p], BACKEND) for p in pieces])
        row = combine_partials(gathered)[0]
        assert row[PARTIAL_COLUMNS.index("count")] == full.numel()
        values = reductions_from_partials(row, ALL_KEYS)
        expected = ref.reduce_many(full.numpy(), ALL_KEYS)
        np.testing.assert_allclose(values, expected, rtol=1e-7)  # E[x^2] - mean^2 gives 1e-4 for 1e-6 here


def test_nan_in_one_shard_makes_the_reductions_nan_and_a_missing_shard_leaves_the_tensor_out():
    pieces = [torch.tensor([1.0, float("nan")]), torch.tensor([2.0])]
    row = combine_partials(np.stack([shard_partials([p], BACKEND) for p in pieces]))[0]
    assert all(np.isnan(reductions_from_partials(row, [("min", False), ("max", False), ("mean", False)])))
    missing = combine_partials(np.stack([shard_partials([torch.ones(2)], BACKEND), shard_partials([None], BACKEND)]))[0]
    assert np.isnan(missing[PARTIAL_COLUMNS.index("count")])


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_health_partials_combine_to_the_full_tensors_health_reductions(offset):
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(7, 5, generator=gen, dtype=torch.float64) ** 3 + offset
    full[0, :4] = torch.tensor([7e4, float("nan"), 0.0, 1e-30])
    full[5, 1] = float("inf")
    keys = [(op, a) for op in ref.HEALTH_REDUCTIONS for a in (False, True)]
    for dtype in (torch.float32, torch.float64):
        tensor = full.to(dtype)
        pieces = [tensor[:4], tensor[4:4], tensor[4:6], tensor[6:]]
        gathered = np.stack([shard_partials([p], BACKEND) for p in pieces])
        values = reductions_from_partials(combine_partials(gathered)[0], keys)
        expected = ref.reduce_many(tensor.numpy(), keys)
        np.testing.assert_allclose(values, expected, rtol=1e-9)


def test_only_the_partials_the_saved_reductions_need_are_computed():
    from smdebug.pytorch.sharded import columns_needed

    assert columns_needed([("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False)]) == (
        "sum", "sum_sq", "min", "max", "m2")
    assert columns_needed([("variance", True)]) == ("sum", "sum_abs", "m2_abs")
    row = shard_partials([torch.arange(4.0)], BACKEND, columns_needed([("l1", False)]))[0]
    assert row[PARTIAL_COLUMNS.index("sum_abs")] == 6.0 and np.isnan(row[PARTIAL_COLUMNS.index("m2")])


def test_a_flight_recorder_on_the_chief_alone_keeps_every_rank_in_the_collectives(runs):
    """The recorder exists only where files are written (include_workers="one": the chief)
    and keeps steps the save config does not save: every rank must still join each step's
    statistics collective, or the chief would wait for peers that never come."""
    counts = [json.load(open(runs / "flight" / f"collectives_{rank}.json")) for rank in (0, 1)]
    # One per step on each rank, counted once the run is closed (issued on the step pipeline).
    assert counts[0]["total"] == counts[1]["total"] == len(counts[0]["per_step"])
    assert "not saved from step" not in (runs / "stderr.txt").read_text()  # no collective timed out

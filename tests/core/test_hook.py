"""The core Hook with numpy tensors: steps, modes, plans, round trips through the Trial."""
import json
import logging
import os
import stat

import numpy as np
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError, OutDirError
from smdebug.trials import create_trial

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "bool", "complex64", "complex128"]


def run_phases(hook, phases, record):
    for mode, n in phases:
        hook.set_mode(mode)
        for _ in range(n):
            hook.begin_step()
            record(hook)
    hook.close()


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_format_example_steps_and_modes(tmp_path):
    """docs/format.md 1.1: TRAIN 4 steps, EVAL 3, TRAIN 2, save_interval 2."""
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=2), save_all=True)
    run_phases(hook, [(smd.modes.TRAIN, 4), (smd.modes.EVAL, 3), (smd.modes.TRAIN, 2)],
               lambda h: h.record("fc.weight", np.full((3, 4), h.global_step, np.float32)))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 2, 4, 6, 7]
    assert trial.steps(mode=smd.modes.TRAIN) == [0, 2, 4]
    assert trial.steps(mode=smd.modes.EVAL) == [0, 2]
    assert trial.mode_modestep(7) == (smd.modes.TRAIN, 4)
    assert trial.global_step(smd.modes.EVAL, 2) == 6
    t = trial.tensor("fc.weight")
    assert np.array_equal(t.value(4, mode=smd.modes.TRAIN), np.full((3, 4), 7, np.float32))
    assert sorted(os.listdir(tmp_path / "run" / "events")) == [f"{s:012d}" for s in (0, 2, 4, 6, 7)]


@pytest.mark.parametrize("include_workers", ["one"])
def test_every_dtype_round_trips_bit_exact(tmp_path, include_workers):
    import ml_dtypes

    rng = np.random.default_rng(0)
    values = {}
    for name in DTYPES:
        dtype = np.dtype(name)
        if dtype.kind == "b":
            values[name] = rng.random((4, 5)) > 0.5
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            values[name] = rng.integers(info.min, info.max, size=(4, 5), dtype=dtype, endpoint=True)
        elif dtype.kind == "c":
            values[name] = (rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))).astype(dtype)
        else:
            values[name] = rng.standard_normal((4, 5)).astype(dtype)
    values["bfloat16"] = rng.standard_normal((3, 3)).astype(ml_dtypes.bfloat16)
    values["float32_special"] = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], np.float32)
    values["scalar0d"] = np.array(3.5)

    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1))
    for mode in (smd.modes.TRAIN, smd.modes.EVAL):
        hook.set_mode(mode)
        hook.begin_step()
        for name, value in values.items():
            hook.save_tensor(f"t/{name}", value, "custom")
    hook.close()

    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1]
    for name, value in values.items():
        for mode in (smd.modes.TRAIN, smd.modes.EVAL):
            got = trial.tensor(f"t/{name}").value(0, mode=mode)
            assert got.dtype == value.dtype, name
            assert got.shape == value.shape, name
            assert got.tobytes() == value.tobytes(), name  # bit-exact, NaN payloads included


def test_reductions_match_numpy_and_are_read_back(tmp_path):
    rc = smd.ReductionConfig(reductions=["min", "max", "mean", "std", "variance", "sum", "prod", "median"],
                             abs_reductions=["mean"], norms=["l1", "l2"], abs_norms=["l2"])
    hook = smd.Hook(out_dir=tmp_path / "run", reduction_config=rc, include_collections=["weights"],
                    save_config=smd.SaveConfig(save_interval=1))
    w = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    hook.begin_step()
    hook.record("net.weight", w)
    hook.close()
    t = create_trial(str(tmp_path / "run")).tensor("net.weight")
    x = w.astype(np.float64)
    expected = {("min", False): x.min(), ("max", False): x.max(), ("mean", False): x.mean(),
                ("std", False): x.std(), ("variance", False): x.var(), ("sum", False): x.sum(),
                ("prod", False): x.prod(), ("median", False): np.median(x), ("mean", True): np.abs(x).mean(),
                ("l1", False): np.abs(x).sum(), ("l2", False): np.sqrt((x * x).sum()),
                ("l2", True): np.sqrt((x * x).sum())}
    saved = t.reduction_values(0)
    assert set(saved) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(saved[key], value, rtol=1e-12)
        np.testing.assert_allclose(t.reduction_value(0, key[0], abs=key[1]), value, rtol=1e-12)
    with pytest.raises(smd.exceptions.TensorUnavailableForStep):
        t.value(0)  # only reductions were saved


def test_reductions_computed_by_the_adapter_are_written_as_handed_over(tmp_path):
    """record_reduced: values an adapter reduced itself reach the file and live listeners
    unchanged, with the shape record the plan asks for; a later record() of the name wins."""
    rc = smd.ReductionConfig(reductions=["min", "max"], norms=["l2"], save_shape=True)
    hook = smd.Hook(out_dir=tmp_path / "run", reduction_config=rc, include_collections=["weights"],
                    save_config=smd.SaveConfig(save_interval=1))
    seen = []
    hook.add_step_listener(seen.append)
    hook.begin_step()
    plan = hook.session.plans.plan_for("net.weight")
    assert plan.reductions == (("min", False), ("max", False), ("l2", False))
    block = hook.session.inbox.reduced_block([(plan, (3, 4))])
    assert block.tags == plan.reduction_tags
    assert hook.session.inbox.record_reduced(block, [np.float64(-1.5), np.float64(2.0), np.float64(7.25)]) == 1
    hook.begin_step()
    session = hook.session
    session.inbox.record_reduced(session.inbox.reduced_block([(session.plans.plan_for("net.weight"), (3, 4))]), [np.float64(0.0)] * 3)
    hook.record("net.weight", np.full((3, 4), 5.0))  # the same name again in the step: the last value is kept
    hook.close()
    t = create_trial(str(tmp_path / "run")).tensor("net.weight")
    assert t.reduction_values(0) == {("min", False): -1.5, ("max", False): 2.0, ("l2", False): 7.25}
    assert t.shape(0) == (3, 4)
    assert t.reduction_value(1, "l2") == pytest.approx(np.sqrt(12 * 25.0))
    assert seen[0].reductions["net.weight"] == {("min", False): -1.5, ("max", False): 2.0, ("l2", False): 7.25}


def test_a_reduced_block_files_many_tensors_and_the_last_record_of_a_name_wins(tmp_path):
    """A ReducedBlock carries several tensors' reductions at once. A name also recorded
    another way in the same step keeps its last record, whichever way it came: a block
    after a record(), a record() after a block, and a second block over the first."""
    rc = smd.ReductionConfig(reductions=["min", "max"])
    hook = smd.Hook(out_dir=tmp_path / "run", reduction_config=rc, include_collections=["weights"],
                    save_config=smd.SaveConfig(save_interval=1))
    names = ["a.weight", "b.weight", "c.weight"]

    def block_of(*chosen):
        return hook.session.inbox.reduced_block([(hook.session.plans.plan_for(name), (2,)) for name in chosen])

    def values(*pairs):
        return [np.float64(v) for pair in pairs for v in pair]

    hook.begin_step()  # step 0: one block, nothing else
    hook.session.inbox.record_reduced(block_of(*names), values((0, 1), (2, 3), (4, 5)))
    hook.begin_step()  # step 1: a.weight recorded, then the block (the block's value wins)
    hook.record("a.weight", np.array([-9.0, 9.0]))
    hook.session.inbox.record_reduced(block_of(*names), values((10, 11), (12, 13), (14, 15)))
    hook.begin_step()  # step 2: the block, then b.weight recorded (the record wins)
    hook.session.inbox.record_reduced(block_of(*names), values((20, 21), (22, 23), (24, 25)))
    hook.record("b.weight", np.array([-7.0, 7.0]))
    hook.begin_step()  # step 3: two blocks overlapping on c.weight (the second wins)
    hook.session.inbox.record_reduced(block_of("a.weight", "c.weight"), values((30, 31), (32, 33)))
    hook.session.inbox.record_reduced(block_of("c.weight"), values((34, 35)))
    hook.close()
    assert hook.enabled

    trial = create_trial(str(tmp_path / "run"))

    def minmax(name, step):
        tensor = trial.tensor(name)
        return tensor.reduction_value(step, "min"), tensor.reduction_value(step, "max")

    assert [minmax(name, 0) for name in names] == [(0, 1), (2, 3), (4, 5)]
    assert [minmax(name, 1) for name in names] == [(10, 11), (12, 13), (14, 15)]
    assert [minmax(name, 2) for name in names] == [(20, 21), (-7, 7), (24, 25)]
    assert minmax("a.weight", 3) == (30, 31) and minmax("c.weight", 3) == (34, 35)
    assert 3 not in trial.tensor("b.weight").steps()


def test_record_reduced_with_the_wrong_number_of_values_disables_the_hook(tmp_path, caplog):
    """An adapter's bug, not the user's: one warning, the hook switches off, training goes on."""
    hook = smd.Hook(out_dir=tmp_path / "run", reduction_config=smd.ReductionConfig(reductions=["min", "max"]),
                    include_collections=["weights"], save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    block = hook.session.inbox.reduced_block([(hook.session.plans.plan_for("net.weight"), None)])
    with caplog.at_level("WARNING"):
        assert hook.session.inbox.record_reduced(block, [np.float64(1.0)]) is None
    assert not hook.enabled
    assert "1 values for a block of 2 reductions" in caplog.text
    hook.close()


def test_shape_only_and_collection_overrides(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1))
    shapes = hook.get_collection("shapes")
    shapes.include("^big")
    shapes.reduction_config = smd.ReductionConfig(save_shape=True)
    hook.session.include("shapes")
    sparse = hook.get_collection("sparse")
    sparse.include("^rare")
    sparse.save_config = smd.SaveConfig(save_interval=3)
    hook.session.include("sparse")
    for _ in range(4):
        hook.begin_step()
        hook.record("big.weight", np.zeros((7, 2)))
        hook.record("rare.x", np.ones(2))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("big.weight").shape(2) == (7, 2)
    assert trial.tensor("rare.x").steps() == [0, 3]


def test_default_collection_disabled_by_end_step_zero(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    hook.get_collection("losses").save_config.end_step = 0
    for _ in range(2):
        hook.begin_step()
        hook.record("model_loss", np.float32(1.0))
        hook.record("fc.weight", np.ones(3))
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names() == ["fc.weight"]


def test_gradients_not_saved_outside_train(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "weights"])
    hook.set_mode(smd.modes.EVAL)
    hook.begin_step()
    hook.record("gradient/fc.weight", np.ones(3))
    hook.record("fc.weight", np.ones(3))
    hook.close()
    assert create_trial(str(tmp_path / "run")).tensor_names() == ["fc.weight"]


def test_save_scalar_and_collections_file(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=10))
    for i in range(3):
        hook.begin_step()
        hook.save_scalar("lr", 0.1 * i)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("scalar/lr").steps() == [0, 1, 2]
    np.testing.assert_allclose(trial.tensor("scalar/lr").value(2), 0.2)
    doc = json.loads((tmp_path / "run/collections/000000000/worker_0_collections.json").read_text())
    assert set(doc) == {"collections", "_meta"}
    losses = doc["collections"]["losses"]
    assert losses["reduction_config"] == {"save_raw_tensor": True, "reductions": "", "save_shape": False}
    assert set(losses["save_config"]) == {"TRAIN", "EVAL", "PREDICT", "GLOBAL"}
    assert losses["save_config"]["TRAIN"]["save_interval"] == 10


def test_sm_metrics_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_METRICS_DIRECTORY", str(tmp_path / "metrics"))
    hook = smd.Hook(out_dir=tmp_path / "run")
    hook.set_mode(smd.modes.TRAIN)
    hook.begin_step()
    hook.save_scalar("acc", 0.5, sm_metric=True)
    hook.close()
    (metrics_file,) = (tmp_path / "metrics").iterdir()
    line = json.loads(metrics_file.read_text().splitlines()[0])
    assert line["MetricName"] == "scalar/acc_TRAIN" and line["Value"] == 0.5 and line["IterationNumber"] == 0


def test_an_unwritable_metrics_directory_costs_the_metric_lines_not_the_tensors(tmp_path, monkeypatch, caplog):
    (tmp_path / "a_file").write_text("")  # the directory cannot be made under a regular file
    monkeypatch.setenv("SAGEMAKER_METRICS_DIRECTORY", str(tmp_path / "a_file" / "metrics"))
    hook = smd.Hook(out_dir=tmp_path / "run")
    with caplog.at_level("WARNING", logger="smdebug"):
        for step in range(3):
            hook.begin_step()
            hook.save_scalar("acc", 0.5 + step, sm_metric=True)
        hook.close()
    assert hook.enabled
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    trial = create_trial(str(tmp_path / "run"), wait_timeout=1)
    assert [trial.tensor("scalar/acc").value(s).item() for s in trial.steps()] == [0.5, 1.5, 2.5]


def test_existing_run_is_refused_unless_overwrite(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run")
    hook.begin_step()
    hook.save_scalar("x", 1.0)
    hook.close()
    with pytest.raises(OutDirError, match="already holds a run"):
        smd.Hook(out_dir=tmp_path / "run")
    smd.Hook(out_dir=tmp_path / "run", overwrite=True).close()
    assert not (tmp_path / "run" / "events").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_dir_fails_fast(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(OutDirError, match="is not writable"):
        smd.Hook(out_dir=locked / "run")


def test_out_dir_that_is_a_file_fails_fast(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutDirError, match="is not writable"):
        smd.Hook(out_dir=tmp_path / "file")


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"include_workers": "some"}, "include_workers must be 'one' or 'all', got 'some'"),
        ({"include_regex": ["(bad"]}, "invalid regex '(bad'"),
        ({"save_config": 5}, "save_config must be a SaveConfig"),
        ({"reduction_config": "min"}, "reduction_config must be a ReductionConfig"),
        ({"save_all": "yes"}, "save_all must be True or False"),
        ({"out_dir": None}, "out_dir is required"),
    ],
)
def test_bad_constructor_input(tmp_path, kwargs, fragment):
    kwargs.setdefault("out_dir", tmp_path / "run")
    with pytest.raises(ConfigError) as info:
        smd.Hook(**kwargs)
    assert fragment in str(info.value)


def test_tensor_names_cannot_escape_out_dir(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_all=True, save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    for name in ("../escape", "/abs/path", "..\\win"):
        hook.record(name, np.ones(2))
    hook.close()
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing outside
    trial = create_trial(str(tmp_path / "run"))
    assert sorted(trial.tensor_names()) == sorted(["../escape", "/abs/path", "..\\win"])


def test_a_value_that_cannot_be_saved_costs_that_tensor_only(tmp_path, caplog):
    class Exploding:
        def __array__(self, *a, **k):
            raise RuntimeError("boom")

    hook = smd.Hook(out_dir=tmp_path / "run", save_all=True, save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.record("good", np.ones(2))
        for _ in range(3):  # training goes on; the bad tensor is reported once
            hook.begin_step()
            assert hook.record("bad", Exploding()) is False
            hook.save_tensor("object", np.array([object()]), "odd")  # the numpy backend refuses these
            hook.record("good", np.ones(2))
        hook.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and "'bad'" in warnings[0] and "boom" in warnings[0] and "'object'" in warnings[1]
    assert hook.enabled
    trial = create_trial(str(tmp_path / "run"), wait_timeout=1)
    assert trial.steps() == [0, 1, 2, 3] and trial.tensor_names() == ["good"]


def test_failure_inside_hook_disables_it_with_one_warning(tmp_path, caplog):
    hook = smd.Hook(out_dir=tmp_path / "run", save_all=True, save_config=smd.SaveConfig(save_interval=1))

    def broken(requests):
        raise RuntimeError("injected")

    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.record("good", np.ones(2))
        hook.begin_step()
        hook.session.backend.materialize = broken  # the backend itself fails: every tensor fails
        hook.record("a", np.ones(2))
        hook.record("b", np.ones(2))
        for _ in range(3):  # training goes on; the hook stays quiet
            hook.begin_step()
            hook.record("good", np.ones(2))
        hook.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "injected" in warnings[0].getMessage()
    assert not hook.enabled
    assert create_trial(str(tmp_path / "run"), wait_timeout=1).steps(show_incomplete_steps=True) == [0]


def test_dry_run_writes_nothing(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", dry_run=True, save_all=True)
    hook.begin_step()
    assert hook.record("x", np.ones(2)) is True
    hook.close()
    assert not (tmp_path / "run").exists()


def test_plan_is_cached_per_name(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", dry_run=True, include_collections=["weights"],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    first = hook.session.plans.plan_for("fc.weight")
    assert first is not None and hook.session.plans.plan_for("fc.weight") is first
    hook.begin_step()
    assert hook.session.plans.plan_for("fc.weight") is first
    assert hook.session.plans.plan_for("fc.bias") is None


def test_step_numbering_resumes_from_checkpoint_state(tmp_path, monkeypatch):
    ckpt_config = tmp_path / "checkpointconfig.json"
    ckpt_config.write_text(json.dumps({"LocalPath": str(tmp_path / "ckpt")}))
    monkeypatch.setenv("CHECKPOINT_CONFIG_FILE_PATH", str(ckpt_config))
    first = smd.Hook(out_dir=tmp_path / "run1", save_config=smd.SaveConfig(save_interval=1))
    first.set_mode(smd.modes.TRAIN)
    for _ in range(3):
        first.begin_step()
    first.close()
    second = smd.Hook(out_dir=tmp_path / "run2", save_config=smd.SaveConfig(save_interval=1))
    second.set_mode(smd.modes.TRAIN)
    second.begin_step()
    assert (second.global_step, second.mode_step) == (3, 3)
    second.close()


def test_a_step_finished_after_the_mode_changed_keeps_its_own_mode_in_metric_names(tmp_path, monkeypatch):
    """A step's records are made on the pipeline's worker, maybe while the training thread is
    already in a step of another mode: metric names take the finished step's mode."""
    import threading

    monkeypatch.setenv("SAGEMAKER_METRICS_DIRECTORY", str(tmp_path / "metrics"))
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1))
    release = threading.Event()
    hook.set_mode(smd.modes.TRAIN)
    hook.begin_step()
    hook._session.submit_work("holding the worker", release.wait, 30)  # the TRAIN step is finished late
    hook.save_tensor("loss", np.float32(0.25), collections_to_write="losses")
    hook.set_mode(smd.modes.EVAL)  # ends the TRAIN step: queued behind the held job
    hook.begin_step()
    release.set()
    hook.close()
    (metrics_file,) = (tmp_path / "metrics").iterdir()
    names = [json.loads(line)["MetricName"] for line in metrics_file.read_text().splitlines()]
    assert names == ["loss_TRAIN"]


def test_the_hook_says_where_it_writes_and_what_it_saves_at_info(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="smdebug"):
        smd.Hook(out_dir=tmp_path / "run", include_collections=["losses"],
                 save_config=smd.SaveConfig(save_interval=7)).close()
    lines = [r.getMessage() for r in caplog.records if "hook:" in r.getMessage()]
    assert len(lines) == 1
    assert f"writing {tmp_path / 'run'} as worker_0" in lines[0] and "losses" in lines[0] and "7" in lines[0]


def test_smdebug_log_level_info_shows_the_line_on_stderr(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "SMDEBUG_LOG_LEVEL": "info"}
    code = f"import smdebug as smd; smd.Hook(out_dir={str(tmp_path / 'run')!r}).close()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "INFO smdebug: smdebug numpy hook: writing" in done.stderr

"""Keras' compiled step functions per kind of step (keras_functions): steps that save
nothing run a graph without capture sites, saved steps one whose sites need no flag, and
the values are those of a run that saves every step."""
import logging

import pytest

tf = pytest.importorskip("tensorflow")


import smdebug.tensorflow as smd  # noqa: E402
from smdebug.tensorflow import keras_functions  # noqa: E402
from smdebug.tensorflow.capture import SpecializedFunction  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

from conftest import make_model  # noqa: E402

# 10 samples, batch 2 -> 5 TRAIN steps per epoch, 2 epochs.
STEPS = list(range(10))
NAMES = ["d1/weights/d1/kernel", "d2/weights/d2/bias", "gradients/d1/kernelGrad", "gradients/d2/biasGrad"]


def fit(out_dir, data, collections, model=None):
    x, y = data
    model = model or make_model()
    # Losses and metrics at step 0 only: the other steps save only ``collections``.
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1000), include_collections=[])
    for name, interval in collections.items():
        hook.get_collection(name).save_config = smd.SaveConfig(save_interval=interval)
        hook.get_collection(name).reduction_config = smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"])
        hook.include_collections.append(name)
    model.fit(x, y, batch_size=2, epochs=2, shuffle=False, callbacks=[hook], verbose=0)
    return model, hook


def assert_same_values(trial, reference, steps_of):
    for name in NAMES:
        assert trial.tensor(name).steps() == steps_of(name), name
        for step in steps_of(name):
            got = {key: float(v) for key, v in trial.tensor(name).reduction_values(step).items()}
            want = {key: float(v) for key, v in reference.tensor(name).reduction_values(step).items()}
            assert set(got) == {("mean", False), ("max", False), ("l2", False)}, (name, step)
            assert got == pytest.approx(want, rel=1e-6), (name, step)


@pytest.fixture(scope="module")
def every_step(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("every") / "run"
    _, hook = fit(out, data, {"weights": 1, "biases": 1, "gradients": 1})
    hook.close()
    return create_trial(str(out))


def saved_every(intervals):
    def steps_of(name):
        interval = intervals["gradients" if name.startswith("gradients/") else
                             "biases" if name.endswith("bias") else "weights"]
        return [s for s in STEPS if s % interval == 0]

    return steps_of


def test_steps_that_save_nothing_run_a_graph_without_capture_sites(tmp_path, data, every_step):
    intervals = {"weights": 3, "biases": 3, "gradients": 3}
    model, hook = fit(tmp_path / "run", data, intervals)
    functions = hook._step_functions._loops[(id(model), "train_function")].functions
    assert isinstance(model.train_function, SpecializedFunction)
    plain = functions[frozenset()]
    saving = [f for saves, f in functions.items() if saves]  # step 0 (with the losses), steps 3, 6, 9
    assert plain.saves is None and plain.variants == []
    assert len(saving) == 2 and all(f.variants and {"weights", "biases", "gradients"} <= f.saves for f in saving)
    # Every variant traced in fit belongs to a saving function: no flag, no switch_case.
    variants = [v for site in hook._capture._sites.values() for v in site.variants.values()]
    assert variants and all(v.owner in saving and v.flag is None for v in variants)
    hook.close()
    assert not isinstance(model.train_function, SpecializedFunction)  # Keras' own again after close
    assert_same_values(create_trial(str(tmp_path / "run")), every_step, saved_every(intervals))


def test_kinds_of_steps_past_the_limit_run_keras_function_with_flagged_sites(tmp_path, data, every_step,
                                                                             monkeypatch):
    # Kinds: {weights, biases, gradients} at 0, nothing at 1, {weights, biases} at 2, {gradients} at 3, ...
    monkeypatch.setattr(keras_functions, "MAX_FUNCTIONS", 2)
    intervals = {"weights": 2, "biases": 2, "gradients": 3}
    model, hook = fit(tmp_path / "run", data, intervals)
    functions = hook._step_functions._loops[(id(model), "train_function")].functions
    assert len(functions) == 2
    variants = [v for site in hook._capture._sites.values() for v in site.variants.values()]
    assert any(v.flag is not None for v in variants) and any(v.owner is not None for v in variants)
    hook.close()
    assert_same_values(create_trial(str(tmp_path / "run")), every_step, saved_every(intervals))


def test_keras_failing_to_make_a_function_keeps_its_own(tmp_path, data, every_step, caplog):
    model = make_model()
    original = model.make_train_function

    def refuse_new(force=False):  # fit's own call (no force) still works
        if force:
            raise RuntimeError("no new functions today")
        return original(force)

    model.make_train_function = refuse_new
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        _, hook = fit(tmp_path / "run", data, {"weights": 1, "biases": 1, "gradients": 1}, model=model)
        assert hook.enabled
        hook.close()
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("smdebug")]
    assert len(warnings) == 1 and "no new functions today" in warnings[0]
    assert_same_values(create_trial(str(tmp_path / "run")), every_step, lambda name: STEPS)


def test_a_graph_without_capture_sites_is_traced_once(tmp_path, data):
    """The default configuration saves nothing from inside the compiled step: the first
    function Keras traces serves every kind of step (no second trace at fit start)."""
    x, y = data
    model = make_model()
    hook = smd.KerasHook(out_dir=tmp_path / "run")
    model.fit(x, y, batch_size=2, epochs=2, validation_data=(x[:4], y[:4]), callbacks=[hook], verbose=0)
    for attr in ("train_function", "test_function"):
        loop = hook._step_functions._loops[(id(model), attr)]
        assert list(loop.functions.values()) == [loop.sole] and not loop.sole.offered, attr
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    # step 0 of TRAIN and of EVAL, and the ends of the 2 epochs (their training logs, as in 1.0.34)
    assert trial.tensor("loss").steps() == [0, 4, 5, 11]

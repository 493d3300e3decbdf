"""The step semantics every adapter's hook keeps, run in each framework's tox env against the
hooks installed there (and against the numpy ``smd.Hook``): steps begin and end through the
facade and reach the run with their modes and mode steps; a stop request is seen at the
next step boundary; a fault inside capture disables capture with one warning and never
reaches training."""
import logging

import numpy as np
import pytest

import smdebug as smd
from installed_hooks import pytest_generate_tests  # noqa: F401 - parametrizes hook_cls
from smdebug.modes import ModeKeys
from smdebug.rules import write_stop_request
from smdebug.trials import create_trial


@pytest.fixture
def make_hook(any_hook_cls, tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_STOP_CHECK_INTERVAL_S", "0")  # look for a stop request at every step
    cls = any_hook_cls
    made = []

    def make(**kwargs):
        hook = cls(out_dir=str(tmp_path / f"run{len(made)}"), save_config=smd.SaveConfig(save_interval=1), **kwargs)
        made.append(hook)
        return hook

    yield make
    for hook in made:
        hook.close()


def test_steps_and_modes_reach_the_run(make_hook):
    hook = make_hook()
    hook.set_mode(smd.modes.TRAIN)
    for i in range(3):
        assert hook.begin_step() is True
        hook.save_scalar("x", float(i))
        hook.end_step()
    hook.set_mode(smd.modes.EVAL)
    hook.begin_step()
    hook.save_scalar("x", 10.0)
    hook.close()
    trial = create_trial(hook.out_dir)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2] and trial.steps(mode=ModeKeys.EVAL) == [0]
    x = trial.tensor("scalar/x")
    assert [float(np.ravel(x.value(s))[0]) for s in (0, 1, 2, 3)] == [0.0, 1.0, 2.0, 10.0]
    assert float(np.ravel(x.value(0, mode=ModeKeys.EVAL))[0]) == 10.0


def test_a_stop_request_is_seen_at_the_next_step_boundary(make_hook):
    hook = make_hook()
    hook.begin_step()
    assert not hook.session.stop_requested
    write_stop_request(hook.out_dir, "the contract test asks")
    hook.begin_step()
    assert hook.session.stop_requested and "the contract test asks" in hook.session.stop_reason


def test_a_fault_in_capture_disables_capture_with_one_warning(make_hook, caplog):
    hook = make_hook()
    hook.begin_step()
    hook.save_scalar("x", 1.0)
    hook.end_step()
    assert hook.session.flush(30)

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    hook.session._records.make = broken  # the step's records cannot be made
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.save_scalar("x", 2.0)
        hook.end_step()
        hook.session.flush(30)
        for _ in range(2):  # training goes on; capture stays off
            assert hook.begin_step() is False
            hook.save_scalar("x", 3.0)
    assert not hook.session.enabled
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "injected fault" in r.getMessage()]
    assert len(warnings) == 1 and "disabled" in warnings[0]
    hook.close()
    assert create_trial(hook.out_dir).steps() == [0]  # what was written before the fault stays readable

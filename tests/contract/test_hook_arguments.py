"""Every framework's hook takes the hook arguments, from their one definition
(``smdebug.capture.arguments.HookArguments``): the same signature, the same docstring text, the same
checks; and each is an adapter that owns its step session (``smdebug.capture.contract``).
Runs in each tox env against the adapters installed there."""
import inspect

import pytest

import smdebug as smd
from installed_hooks import pytest_generate_tests  # noqa: F401 - parametrizes hook_cls

def test_adapter_hooks_share_the_core_arguments(hook_cls, tmp_path):
    cls = hook_cls
    from smdebug.capture.arguments import HookArguments

    core = list(inspect.signature(HookArguments).parameters.values())
    numpy_params = list(inspect.signature(smd.Hook).parameters.values())
    assert numpy_params[:len(core)] == core  # then its own, keyword-only: the worker of a job of processes
    assert [(p.name, p.kind) for p in numpy_params[len(core):]] == [("rank", inspect.Parameter.KEYWORD_ONLY),
                                                                    ("world_size", inspect.Parameter.KEYWORD_ONLY)]
    params = list(inspect.signature(cls).parameters.values())
    assert params[:len(core)] == core
    assert all(p.kind is p.KEYWORD_ONLY for p in params[len(core):])  # an adapter's own, after them
    shared = HookArguments.__doc__.split("    Args:\n", 1)[1]
    assert shared in smd.Hook.__doc__ and shared in cls.__doc__
    with pytest.raises(smd.exceptions.ConfigError, match="include_workers must be 'one' or 'all'"):
        cls(out_dir=str(tmp_path / "run"), include_workers="some")
    with pytest.raises(TypeError, match="save_intervall"):
        cls(out_dir=str(tmp_path / "run"), save_intervall=3)
    # Positional, as the original's users wrote them: out_dir first.
    hook = cls(str(tmp_path / "positional"), False, None, True)
    assert hook.dry_run and hook.out_dir == str(tmp_path / "positional")
    hook.close()


def test_adapter_hooks_keep_the_declared_contract(hook_cls, tmp_path):
    cls = hook_cls
    from smdebug.capture.backend import TensorBackend
    from smdebug.capture.contract import Adapter, SessionSurface
    from smdebug.capture.session import StepSession

    hook = cls(out_dir=str(tmp_path / "run"))
    try:
        assert isinstance(hook, Adapter) and isinstance(hook.session, StepSession)
        assert isinstance(hook.session, SessionSurface) and hook.session.adapter is hook
        assert isinstance(hook.session.backend, TensorBackend)
    finally:
        hook.close()


def test_an_adapter_that_breaks_the_contract_fails_at_construction(tmp_path):
    from smdebug.capture.backend import TensorBackend

    from smdebug.capture.arguments import HookArguments
    from smdebug.capture.contract import ADAPTER_CALLBACKS, Worker
    from smdebug.capture.session import StepSession

    class NoBackend(smd.Hook):
        def make_backend(self):
            return object()

    class BadRank(smd.Hook):
        def worker(self):
            return Worker(2, 2, "worker_2")

    with pytest.raises(TypeError, match=r"NoBackend.make_backend\(\) must return a smdebug.capture.backend.TensorBackend"):
        NoBackend(out_dir=str(tmp_path / "a"))
    with pytest.raises(TypeError, match=r"0 <= rank < world size, got \(2, 2\)"):
        BadRank(out_dir=str(tmp_path / "b"))

    class Partial:
        """An adapter that is no smd.Hook and lacks a declared callback."""

        framework = "toy"
        profile = smd.Hook.profile

        def worker(self):
            return Worker.numbered(0, 1)

        def make_backend(self):
            return smd.backend.NumpyBackend()

        def collection_object(self, collection, obj):
            pass

        def on_step_begin(self, saving):
            pass

        def on_step_end(self):
            pass

        def on_mode_change(self, mode):
            pass

        def on_close(self):
            pass

        def on_disabled(self, reason):
            pass

    assert "on_step_failed" in ADAPTER_CALLBACKS
    with pytest.raises(TypeError, match=r"Partial is not a smdebug adapter: it lacks the callbacks "
                                        r"\['on_step_failed'\]"):
        StepSession(Partial(), HookArguments(out_dir=str(tmp_path / "c")))
    assert not (tmp_path / "c").exists()  # refused before touching the disk

    class Incomplete(TensorBackend):  # no materialize
        def accepts(self, value):
            return True

        def snapshot(self, value, needs_copy):
            return value

    with pytest.raises(TypeError, match="materialize"):
        Incomplete()


def test_adapters_call_only_the_declared_session_surface():
    """Every adapter reaches the core through its session's declared surface
    (``smdebug.capture.contract.SessionSurface``), never through the session's other members."""
    import pathlib
    import re

    from smdebug.capture.contract import INBOX_MEMBERS, PLAN_MEMBERS, SESSION_MEMBERS

    import importlib.util

    session = r"(?:self\._session|self\.session|hook\._session|hook\.session|(?<![\w.`])session)"
    calls = re.compile(session + r"\.(\w+)")
    part_calls = {part: (re.compile(session + rf"\.{part}\.(\w+)"), members)
                  for part, members in (("plans", PLAN_MEMBERS), ("inbox", INBOX_MEMBERS))}
    undeclared = {}
    for framework in ("pytorch", "tensorflow", "xgboost", "mxnet", "lightning", "transformers"):
        spec = importlib.util.find_spec(f"smdebug.{framework}")  # its files, installed or editable
        if spec is None:  # not in this layout (a bare core on sys.path)
            continue
        for path in sorted(pathlib.Path(spec.origin).parent.glob("*.py")):
            text = path.read_text()
            for name in calls.findall(text):
                if name not in SESSION_MEMBERS:
                    undeclared.setdefault(name, set()).add(f"{framework}/{path.name}")
            for part, (part_call, members) in part_calls.items():
                for name in part_call.findall(text):
                    if name not in members:
                        undeclared.setdefault(f"{part}.{name}", set()).add(f"{framework}/{path.name}")
    assert not undeclared, undeclared


def test_callbacks_are_checked_by_signature_and_near_misses_are_named(tmp_path, caplog):
    """An override that cannot take the callback's arguments fails at construction; a public
    ``on_*`` method one typo away from a callback (never called) is named in a warning."""
    import logging

    class WrongArity(smd.Hook):
        def on_step_begin(self):  # the session passes whether the step saves
            pass

    with pytest.raises(TypeError, match=r"WrongArity breaks the smdebug adapter contract: on_step_begin\(\) "
                                        r"\(declared on_step_begin\(saving\)\)"):
        WrongArity(out_dir=str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()

    class Misspelled(smd.Hook):
        def on_step_ended(self):
            pass

    with caplog.at_level(logging.WARNING, logger="smdebug"):
        Misspelled(out_dir=str(tmp_path / "b")).close()
        Misspelled(out_dir=str(tmp_path / "c")).close()
    warned = [r.getMessage() for r in caplog.records if "on_step_ended" in r.getMessage()]
    assert warned == ["smdebug: Misspelled.on_step_ended is not an adapter callback and is never called; did you "
                      "mean on_step_end? (smdebug.capture.contract.Adapter)"]


def test_the_session_calls_back_at_step_begin_mode_change_and_close(tmp_path):
    calls = []

    class Recording(smd.Hook):
        def on_step_begin(self, saving):
            calls.append(("begin", self.session.global_step, saving))

        def on_mode_change(self, mode):
            calls.append(("mode", mode.name, self.session.mode.name))  # before the session switches

        def on_step_end(self):
            calls.append(("end", self.session.global_step))

        def on_close(self):
            calls.append(("close", self.session.closed))

    hook = Recording(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=2))
    hook.set_mode(smd.modes.TRAIN)
    hook.begin_step()
    hook.begin_step()
    hook.close()
    assert calls == [("mode", "TRAIN", "GLOBAL"), ("begin", 0, True), ("end", 0), ("begin", 1, False), ("end", 1),
                     ("close", True)]

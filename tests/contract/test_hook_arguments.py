"""Every framework's hook takes the hook arguments, from their one definition
(``smdebug.capture.arguments.HookArguments``): the same signature, the same docstring text, the same
checks; and each is an adapter that owns its step session (``smdebug.capture.contract``).
Runs in each tox env against the adapters installed there."""
import importlib
import inspect

import pytest

import smdebug as smd

HOOKS = [("smdebug.pytorch", "Hook", "torch"), ("smdebug.mxnet", "Hook", "mxnet"),
         ("smdebug.xgboost", "Hook", "xgboost"), ("smdebug.tensorflow", "KerasHook", "tensorflow"),
         ("smdebug.tensorflow", "SessionHook", "tensorflow")]


def _hook_classes():
    found = []
    for module, name, framework in HOOKS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except ImportError:  # the framework is not installed here
            continue
    return found


@pytest.mark.parametrize("cls", _hook_classes() or [pytest.param(None, marks=pytest.mark.skip("no framework here"))],
                         ids=lambda c: getattr(c, "__qualname__", "none"))
def test_adapter_hooks_share_the_core_arguments(cls, tmp_path):
    from smdebug.capture.arguments import HookArguments

    core = list(inspect.signature(HookArguments).parameters.values())
    assert list(inspect.signature(smd.Hook).parameters.values()) == core
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


@pytest.mark.parametrize("cls", _hook_classes() or [pytest.param(None, marks=pytest.mark.skip("no framework here"))],
                         ids=lambda c: getattr(c, "__qualname__", "none"))
def test_adapter_hooks_keep_the_declared_contract(cls, tmp_path):
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

        def on_step_end(self):
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

    from smdebug.capture.contract import SESSION_MEMBERS

    package = pathlib.Path(smd.__file__).parent
    calls = re.compile(r"(?:self\._session|self\.session|hook\._session|hook\.session|(?<![\w.`])session)\.(\w+)")
    undeclared = {}
    for framework in ("pytorch", "tensorflow", "xgboost", "mxnet", "lightning", "transformers"):
        for path in sorted((package / framework).glob("*.py")):
            for name in calls.findall(path.read_text()):
                if name not in SESSION_MEMBERS:
                    undeclared.setdefault(name, set()).add(f"{framework}/{path.name}")
    assert not undeclared, undeclared

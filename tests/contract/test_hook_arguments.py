"""Every framework's hook takes the core Hook's arguments, from their one definition
(``smdebug.Hook.__init__``): the same signature, the same docstring text, the same checks.
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
    core = list(inspect.signature(smd.Hook.__init__).parameters.values())[1:]  # without self
    params = list(inspect.signature(cls).parameters.values())
    assert params[:len(core)] == core
    assert all(p.kind is p.KEYWORD_ONLY for p in params[len(core):])  # an adapter's own, after them
    shared = smd.Hook.__doc__.split("    Args:\n", 1)[1]
    assert shared in cls.__doc__
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
    from smdebug.backend import TensorBackend
    from smdebug.contract import StepSession

    hook = cls(out_dir=str(tmp_path / "run"))
    try:
        assert isinstance(hook, StepSession)
        assert isinstance(hook.backend, TensorBackend)
    finally:
        hook.close()


def test_an_adapter_that_breaks_the_contract_fails_at_construction(tmp_path):
    from smdebug.backend import TensorBackend

    class NoBackend(smd.Hook):
        def _make_backend(self):
            return object()

    class BadRank(smd.Hook):
        def _distributed_info(self):
            return 2, 2

    with pytest.raises(TypeError, match=r"NoBackend._make_backend\(\) must return a smdebug.backend.TensorBackend"):
        NoBackend(out_dir=str(tmp_path / "a"))
    with pytest.raises(TypeError, match=r"0 <= rank < world size, got \(2, 2\)"):
        BadRank(out_dir=str(tmp_path / "b"))

    class Incomplete(TensorBackend):  # no materialize
        def accepts(self, value):
            return True

        def snapshot(self, value, needs_copy):
            return value

    with pytest.raises(TypeError, match="materialize"):
        Incomplete()

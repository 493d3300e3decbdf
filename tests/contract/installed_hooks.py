"""The framework hooks installed in this tox env, for the contract tests. A test module that
imports :func:`pytest_generate_tests` runs a test taking ``hook_cls`` once per hook class
found here (none: skipped, saying so), and one taking ``any_hook_cls`` for the numpy
``smd.Hook`` too. (Not a conftest: the framework folders' tests import their own.)"""
import importlib

import pytest

HOOKS = [("smdebug.pytorch", "Hook"), ("smdebug.mxnet", "Hook"), ("smdebug.xgboost", "Hook"),
         ("smdebug.tensorflow", "KerasHook"), ("smdebug.tensorflow", "SessionHook")]


def hook_classes():
    found = []
    for module, name in HOOKS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except ImportError:  # the framework is not installed here
            continue
    return found


def pytest_generate_tests(metafunc):
    if "hook_cls" in metafunc.fixturenames:
        found = hook_classes() or [pytest.param(None, marks=pytest.mark.skip("no framework here"))]
        metafunc.parametrize("hook_cls", found, ids=lambda c: getattr(c, "__qualname__", "none"))
    if "any_hook_cls" in metafunc.fixturenames:  # the numpy smd.Hook too
        import smdebug as smd

        metafunc.parametrize("any_hook_cls", [smd.Hook, *hook_classes()], ids=lambda c: c.__module__ + "." + c.__qualname__)

"""The instrumentor base every adapter's zero-code-change module derives from."""
import logging
import types

import numpy as np

from smdebug.capture.instrumentation import Instrumentor


class _NumpyInstrumentor(Instrumentor):
    """Replaces a function of a module made here, checking numpy's installed version."""

    framework = "numpy"
    distribution = "numpy"

    def __init__(self, target, supported):
        super().__init__()
        self.target, self.supported, self.installs = target, supported, 0

    def install(self):
        self.installs += 1
        self.patches.replace(self.target, "train", lambda original: lambda: ("wrapped", original()))


def _target():
    module = types.ModuleType("fake_framework")
    module.train = lambda: "trained"
    return module


def test_instrument_is_idempotent_and_uninstrument_restores():
    target = _target()
    inst = _NumpyInstrumentor(target, ((1,), None))
    inst.instrument()
    inst.instrument()
    assert inst.installs == 1 and inst.is_instrumented()
    assert target.train() == ("wrapped", "trained")
    inst.uninstrument()
    inst.uninstrument()
    assert not inst.is_instrumented() and target.train() == "trained"


def test_an_unsupported_version_is_not_instrumented_with_one_warning(caplog):
    target = _target()
    inst = _NumpyInstrumentor(target, ((99,), None))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        inst.instrument()
        inst.instrument()
    assert inst.installs == 0 and not inst.is_instrumented() and target.train() == "trained"
    warnings = [r.getMessage() for r in caplog.records if "zero code change supports" in r.getMessage()]
    assert len(warnings) == 1
    assert f"numpy >= 99; numpy {np.__version__} is installed" in warnings[0]


def test_version_ranges_compare_release_numbers():
    inst = _NumpyInstrumentor(_target(), ((1, 9), (2,)))
    assert inst.supports("1.9.1") and inst.supports("1.10") and not inst.supports("2.0.0")
    assert not inst.supports("1.8.2")
    assert _NumpyInstrumentor(_target(), ((2, 0), None)).supports("2.13.0+cpu")
    assert inst.supported_text() == ">= 1.9, < 2"

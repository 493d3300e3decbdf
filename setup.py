"""Packaging metadata lives in setup.cfg; this file only adds the zero-code-change ``.pth``.

setuptools cannot place a file at the root of site-packages from setup.cfg alone. The
``build_py`` below writes ``smdebug_zero_code_change.pth`` next to the ``smdebug``
package in the build tree, so wheels (``pip install .``, tox) install it into
site-packages, where Python runs its one line at every start. That line costs one
environment lookup; only when ``SMDEBUG_CONFIG_FILE_PATH`` is set (and ``USE_SMDEBUG`` does
not turn smdebug off) does it import
``smdebug.capture.zero_code_change``, whose import installs the instrumentation
(docs/zero_code_change.md).
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "smdebug_zero_code_change.pth"
# A .pth line that starts with "import" is executed by site.py; everything must fit on it.
# USE_SMDEBUG=0/false/no/off is checked here too, so that a disabled run imports nothing
# (smdebug would import numpy: ~0.2 s at every interpreter start).
PTH_LINE = (
    'import os; os.environ.get("SMDEBUG_CONFIG_FILE_PATH") and '
    'os.environ.get("USE_SMDEBUG", "").strip().lower() not in ("0", "false", "no", "off", "n", "f") and '
    '__import__("smdebug.capture.zero_code_change")\n'
)


class BuildPyWithPth(build_py):
    """``build_py`` that also writes the zero-code-change ``.pth`` at the build root."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, PTH_NAME)
        os.makedirs(self.build_lib, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + [os.path.join(self.build_lib, PTH_NAME)]


def _editable_wheel_with_pth():
    """``editable_wheel`` (``pip install -e .``) that also puts the ``.pth`` in the editable
    wheel, so that zero code change works in development installs too. It extends a
    setuptools internal (the strategy that writes the wheel); where that is not there, the
    editable install goes on without the ``.pth`` (a warning says so) rather than fail."""
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:  # setuptools < 64: no PEP 660 editable wheels
        return {}

    class WithPth:
        def __init__(self, strategy):
            self.strategy = strategy

        def __enter__(self):
            self.strategy.__enter__()
            return self

        def __exit__(self, *exc):
            return self.strategy.__exit__(*exc)

        def __call__(self, wheel, files, mapping):
            self.strategy(wheel, files, mapping)
            wheel.writestr(PTH_NAME, PTH_LINE.encode("utf-8"))

    class EditableWheelWithPth(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            strategy = super()._select_strategy(*args, **kwargs)
            if not (callable(strategy) and hasattr(strategy, "__enter__")):
                print(f"warning: {PTH_NAME} not added to the editable install: zero code change is off there")
                return strategy
            return WithPth(strategy)

    if not hasattr(editable_wheel, "_select_strategy"):
        return {}
    return {"editable_wheel": EditableWheelWithPth}


setup(cmdclass={"build_py": BuildPyWithPth, **_editable_wheel_with_pth()})

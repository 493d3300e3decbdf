"""Packaging metadata lives in setup.cfg; this file only adds the zero-code-change ``.pth``.

setuptools cannot place a file at the root of site-packages from setup.cfg alone. The
``build_py`` below writes ``smdebug_zero_code_change.pth`` next to the ``smdebug``
package in the build tree, so wheels (``pip install .``, tox) install it into
site-packages, where Python runs its one line at every start. That line costs one
environment lookup; only when ``SMDEBUG_CONFIG_FILE_PATH`` is set (and ``USE_SMDEBUG`` does
not turn smdebug off) does it import
``smdebug.zero_code_change``, whose import installs the instrumentation
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
    '__import__("smdebug.zero_code_change")\n'
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


setup(cmdclass={"build_py": BuildPyWithPth})

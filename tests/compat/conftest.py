"""Fixtures for the interoperability tests with the original smdebug 1.0.34.

The original is also imported as ``smdebug``, so it lives in its own virtualenv and runs
in a subprocess: ``$SMDEBUG_ORIGINAL_PYTHON`` names that interpreter (``tox -e compat``
sets it to the ``original`` tox environment's python). Without it these tests skip,
unless ``SMDEBUG_REQUIRE_ORIGINAL=1`` (tox sets it), where a missing interpreter fails.

To run them by hand::

    python -m venv /tmp/orig-venv
    /tmp/orig-venv/bin/pip install smdebug==1.0.34 "numpy<2" "pandas<3" "protobuf<4" \
        requests psutil "setuptools<81" "torch==2.13.0+cpu"
    SMDEBUG_ORIGINAL_PYTHON=/tmp/orig-venv/bin/python python -m pytest tests/compat
"""
import os
import sys

import pytest

# compat_json (shared with the scripts the original runs) and compat_runner.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compat_runner import find_original_python


@pytest.fixture(scope="session")
def original_python():
    """Path of the interpreter that has the original smdebug 1.0.34 installed."""
    return find_original_python()


@pytest.fixture(scope="session", autouse=True)
def _layout_1034_for_the_original():
    """The original reads smdebug 1.0.34's files (docs/format.md 1-3): every run these tests
    write for it is written in that layout, unless a test writes a run store on purpose (and
    converts it: test_original_reads_ours.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")
        yield

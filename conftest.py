"""Fixtures every test folder shares. Here, not in tests/: a conftest there would put tests/
on sys.path, where tests/mxnet would shadow the mxnet package. pytest loads it before each
folder's own conftest, so a folder's ``from conftest import ...`` still finds its own."""
import logging

import pytest


@pytest.fixture
def smdebug_warnings(caplog):
    """``smdebug_warnings()``: the warning records smdebug logged so far in this test;
    ``smdebug_warnings(messages=True)``: their messages."""
    caplog.set_level(logging.WARNING)

    def collect(messages: bool = False):
        found = [r for r in caplog.records if r.name.startswith("smdebug") and r.levelno >= logging.WARNING]
        return [r.getMessage() for r in found] if messages else found

    return collect


@pytest.fixture
def layout_1034(monkeypatch):
    """The test is about smdebug 1.0.34's files (``events/``, ``index/``: docs/format.md 1-3):
    hooks and writers of this test write that layout, not the run store."""
    monkeypatch.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")

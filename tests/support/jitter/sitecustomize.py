"""Timing jitter for race hunting (tests only): with ``SMDEBUG_TEST_JITTER=<seconds>`` and
this folder on ``PYTHONPATH``, every job of smdebug's step pipeline and every item of its
writer thread waits a random time up to that many seconds first, in this process and in the
processes it starts. Races between the training thread, the hook's threads and other workers
of a run then show in a few runs instead of one CI run in many (docs/faults.md).

    SMDEBUG_TEST_JITTER=0.02 PYTHONPATH=tests/support/jitter python -m pytest tests/core
"""
import importlib.abc
import importlib.util
import os
import random
import sys
import time

_MAX_DELAY = float(os.environ.get("SMDEBUG_TEST_JITTER", "0") or 0)


def _delayed(original):
    def delayed(self, *args):
        time.sleep(random.random() * _MAX_DELAY)
        return original(self, *args)
    return delayed


def _jitter_pipeline(module):
    module.StepPipeline._execute = _delayed(module.StepPipeline._execute)
    sys.stderr.write(f"smdebug test jitter: step pipeline jobs delayed up to {_MAX_DELAY} s\n")


def _jitter_writer(module):
    module.RunWriter._handle = _delayed(module.RunWriter._handle)
    sys.stderr.write(f"smdebug test jitter: writer items delayed up to {_MAX_DELAY} s\n")


_PATCHES = {"smdebug.capture.pipeline": _jitter_pipeline, "smdebug.storage.writer.run_writer": _jitter_writer}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each module of :data:`_PATCHES` right after it is first imported."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.pop(name, None)
        if patch is None:
            return None
        if not _PATCHES:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _MAX_DELAY > 0:
    sys.meta_path.insert(0, _PatchOnImport())

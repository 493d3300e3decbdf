"""Running the original smdebug 1.0.34 in a subprocess, from our tests (conftest.py says how to set it up)."""
import json
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ORIGINAL_PYTHON_ENV = "SMDEBUG_ORIGINAL_PYTHON"
REQUIRE_ENV = "SMDEBUG_REQUIRE_ORIGINAL"
ORIGINAL_VERSION = "1.0.34"


def original_env():
    """Environment for the original's interpreter: nothing of ours leaks into its imports."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SMDEBUG_CONFIG_FILE_PATH",
                        "TRAINING_JOB_NAME", "PYTHONSTARTUP")}
    env.update({
        # The original sleeps this long (default 1 s) after seeing training_job_end.ts.
        "SMDEBUG_TRAINING_END_DELAY_REFRESH": "0",
        "SMDEBUG_LOG_LEVEL": "error",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def _fail_or_skip(reason):
    if os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0"):
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so the original is required here)")
    pytest.skip(reason)


def find_original_python():
    """Path of the interpreter with the original smdebug 1.0.34; skips (or fails, if required) without it."""
    path = os.environ.get(ORIGINAL_PYTHON_ENV, "").strip()
    if not path:
        _fail_or_skip(
            f"{ORIGINAL_PYTHON_ENV} is not set: point it at a python with the original smdebug=={ORIGINAL_VERSION} "
            "(`tox -e original,compat` does this)"
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        _fail_or_skip(f"{ORIGINAL_PYTHON_ENV}={path!r} is not an executable file")
    probe = subprocess.run(
        [path, "-c", "import smdebug; print(smdebug.__version__)"],
        env=original_env(), capture_output=True, text=True, timeout=120, cwd=HERE,
    )
    lines = probe.stdout.strip().splitlines()
    version = lines[-1] if lines else ""
    if probe.returncode != 0 or version != ORIGINAL_VERSION:
        _fail_or_skip(
            f"{ORIGINAL_PYTHON_ENV}={path!r} does not import smdebug {ORIGINAL_VERSION} "
            f"(got {version!r}, exit {probe.returncode}: {probe.stderr.strip()[-500:]})"
        )
    return path


def run_original(python, script, *args, cwd, timeout=180):
    """Run one of this folder's scripts with the original's interpreter; its output on failure."""
    result = subprocess.run(
        [python, os.path.join(HERE, script), *map(str, args)],
        env=original_env(), capture_output=True, text=True, timeout=timeout, cwd=str(cwd),
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{script} failed under the original smdebug (exit {result.returncode}):\n"
            f"{result.stderr[-4000:]}\n{result.stdout[-2000:]}"
        )
    return result


def load_json(path):
    with open(path) as fh:
        return json.load(fh)


def ranked_hook(rank, **kwargs):
    """The numpy hook as worker ``rank`` of a 2-process job (``worker()`` is the adapter
    callback that says which worker this is)."""
    import smdebug as smd
    from smdebug.capture.contract import Worker

    class RankedHook(smd.Hook):
        def worker(self):
            return Worker.numbered(rank, 2)

    return RankedHook(**kwargs)

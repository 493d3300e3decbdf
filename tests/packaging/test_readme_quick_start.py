"""The README's quick start, run as written: its one command, in a copy of the checkout,
makes a fresh ``.venv``, installs the package with the CPU torch wheel and runs the example
end to end (the "Looking at a run" section is run by tests/pytorch/test_readme.py)."""
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick_start_command() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = [b.strip() for b in blocks if "python -m venv .venv" in b]
    assert len(commands) == 1, "the README has one quick-start command making .venv"
    return commands[0]


@pytest.mark.timeout(1500)
def test_the_quick_start_command_installs_and_runs_the_example(tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".tox", ".git", ".venv", "build", "*.egg-info",
                                                                  "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMDEBUG_", "VIRTUAL_ENV"))}
    done = subprocess.run(["bash", "-c", quick_start_command()], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=1400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # The example opens its run with a Trial and prints what it read, then where the run is.
    assert re.search(r"\d+ saved steps: \d+ TRAIN", done.stdout), done.stdout[-2000:]
    assert "plot saved to" in done.stdout and "run directory: " in done.stdout, done.stdout[-2000:]

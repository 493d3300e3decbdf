"""The README's "Looking at a run", command by command, on the run the quick start's example
writes: each shell line runs as written (the run's path aside) and each Python line runs."""
import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("pandas")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")


def section(title: str) -> str:
    text = open(README, encoding="utf-8").read()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def shell_lines(block: str):
    """The commands of the README's ```bash blocks in ``block``, continuation lines joined."""
    for code in re.findall(r"```bash\n(.*?)```", block, re.S):
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                yield line


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("readme") / "cnn_run")
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "pytorch", "train_cnn.py"), "--out-dir", out],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    # "Comparing runs" runs the example again into /tmp/cnn_run_b; with the same seeds it
    # saves the same values (test_pytorch_compare.py checks that on its own runs): a copy.
    shutil.copytree(out, out + "_b")
    return out


def test_looking_at_a_run_shell_commands(cnn_run, tmp_path):
    pytest.importorskip("matplotlib")
    commands = [line for line in shell_lines(section("Looking at a run")) if line.startswith("smdebug")]
    assert len(commands) >= 8, commands
    for command in commands:
        argv = command.replace("/tmp/cnn_run", cnn_run).split()
        argv = [a.strip("'") for a in argv]
        done = subprocess.run([sys.executable, "-m", "smdebug", *argv[1:]], capture_output=True, text=True,
                              timeout=300, cwd=str(tmp_path))
        # `smdebug rules` exits 1 when a rule fires; every other line must succeed.
        allowed = (0, 1) if argv[1:2] == ["rules"] else (0,)
        assert done.returncode in allowed, f"{command}\n{done.stderr[-2000:]}"
    for made in ("loss_and_grads.png", "hist.png", "grads.png", "values.csv", "compare.png",
                 "cnn_parquet/worker=worker_0/mode=TRAIN/part-0.parquet", "report.html"):
        assert os.path.getsize(tmp_path / made) > 0, made


def test_looking_at_a_run_python_lines(cnn_run):
    lines = [m.group(1) for m in re.finditer(r"^>>> (.*)$", section("Looking at a run"), re.M)]
    assert any("to_dataframe" in line for line in lines)
    scope = {}
    exec("from smdebug.trials import create_trial", scope)
    for line in lines:
        exec(line.replace("/tmp/cnn_run", cnn_run), scope)  # each line of the README runs


def test_training_health_runs_as_written(tmp_path):
    """The README's "Training health" example, its run directory moved to tmp_path."""
    code = re.findall(r"```python\n(.*?)```", section("Training health"), re.S)[0]
    code = code.replace('"/tmp/health_run"', repr(str(tmp_path / "health_run")))
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    ratios = scope["ratios"]
    assert "Sequential_0.weight" in set(ratios["tensor"]) and set(ratios["step"]) == {0}
    assert ((0 < ratios["value"]) & (ratios["value"] < 1)).all()
    trial = scope["trial"]
    assert {"update/Sequential_0.weight", "optimizer/Sequential_0.weight/exp_avg"} <= set(trial.tensor_names())
    assert trial.tensor("Sequential_0.weight").reduction_value(0, "kurtosis") > 1

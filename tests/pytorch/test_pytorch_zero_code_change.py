"""Zero-code-change: an unmodified PyTorch script, configured only by the environment.

The scripts run in fresh interpreters. Where this package is installed normally (tox, a
wheel) the ``smdebug_zero_code_change.pth`` in site-packages starts the bootstrap; in an
editable development install (no ``.pth``) the test puts the same line in a
``sitecustomize.py`` on ``PYTHONPATH``. Either way the line is the one ``setup.py``
installs, read from there.
"""
import ast
import json
import os
import site
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pt_helpers import make_model, write_config  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP_PY = os.path.join(REPO, "setup.py")
PTH_NAME = "smdebug_zero_code_change.pth"

# The user's script: no smdebug anywhere. It prints its losses and whether smdebug was imported.
SCRIPT = """
import json, sys
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

class Scale(torch.nn.Module):  # a parameterless transform, called on its own
    def forward(self, x):
        return x * 0.5

class Data(torch.utils.data.Dataset):  # applies the transform in a DataLoader worker process
    def __len__(self):
        return 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return Scale()(torch.randn(4, generator=g)), int(torch.randint(0, 3, (), generator=g))

torch.manual_seed(0)
model, criterion, scale = Net(), torch.nn.CrossEntropyLoss(), Scale()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
loader = torch.utils.data.DataLoader(Data(), batch_size=5, num_workers=1)
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(scale(x)), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
model.eval()
with torch.no_grad():
    for i in range(3):
        criterion(model(torch.randn(5, 4)), torch.randint(0, 3, (5,)))
print(json.dumps({"losses": losses, "smdebug_imported": "smdebug" in sys.modules,
                  "fc1_hooks": len(model.fc1._forward_hooks)}))
"""


def pth_line():
    """The line setup.py writes into the .pth file (read without running setup.py)."""
    tree = ast.parse(open(SETUP_PY).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PTH_LINE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("PTH_LINE not found in setup.py")


def installed_pth():
    """The .pth in this interpreter's site-packages, if the package was installed normally."""
    dirs = set(site.getsitepackages() + [sysconfig.get_paths()["purelib"]])
    found = [os.path.join(d, PTH_NAME) for d in dirs if os.path.isfile(os.path.join(d, PTH_NAME))]
    return found[0] if found else None


def run_script_process(tmp_path, env_overrides):
    """The unmodified training script, run in a new interpreter with the bootstrap in place."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "USE_SMDEBUG")}
    env.update(env_overrides)
    if installed_pth() is None:
        boot = tmp_path / "boot"
        boot.mkdir(exist_ok=True)
        (boot / "sitecustomize.py").write_text(pth_line())
        env["PYTHONPATH"] = os.pathsep.join([str(boot)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]  # training itself always goes on
    return done


def run_script(tmp_path, env_overrides):
    done = run_script_process(tmp_path, env_overrides)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def config(tmp_path):
    out = tmp_path / "run"
    path = write_config(tmp_path / "hook.json", out, {"save_interval": "2"},
                        ["weights", "gradients", ("fc1_outputs", {"include_regex": "fc1_output"})])
    return path, str(out)


def test_unmodified_script_saves_configured_collections(tmp_path, config):
    path, out = config
    result = run_script(tmp_path, {"SMDEBUG_CONFIG_FILE_PATH": path})
    assert result["smdebug_imported"]
    trial = create_trial(out)
    # 6 training steps (one per optimizer step), then 3 evaluation steps; every 2nd mode step.
    assert trial.steps() == [0, 2, 4, 6, 8]
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("TRAIN", 2), ("TRAIN", 4), ("EVAL", 0), ("EVAL", 2)]
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 2, 4]  # no gradients in EVAL
    assert trial.tensor("Net_fc2.weight").steps() == [0, 2, 4, 6, 8]
    assert trial.tensor("fc1_output_0").value(8).shape == (5, 8)
    loss = trial.tensor("CrossEntropyLoss_output_0")  # losses: saved by default
    np.testing.assert_allclose([loss.value(s) for s in (0, 2, 4)], [result["losses"][i] for i in (0, 2, 4)],
                               rtol=1e-6)
    assert result["fc1_hooks"] == 1  # step 8 saves fc1's output


def test_use_smdebug_0_turns_it_off(tmp_path, config):
    path, out = config
    result = run_script(tmp_path, {"SMDEBUG_CONFIG_FILE_PATH": path, "USE_SMDEBUG": "0"})
    assert not os.path.exists(out)
    assert result["fc1_hooks"] == 0
    assert not result["smdebug_imported"]  # checked before importing smdebug (and numpy through it)


def test_without_the_variable_smdebug_is_not_even_imported(tmp_path):
    result = run_script(tmp_path, {})
    assert result == {"losses": result["losses"], "smdebug_imported": False, "fc1_hooks": 0}
    assert sorted(os.listdir(tmp_path)) in (["boot", "train.py"], ["train.py"])


def test_setup_py_puts_the_pth_at_the_site_packages_root(tmp_path, config):
    """What ``pip install .`` installs: build_py output, then Python's own .pth processing."""
    build = tmp_path / "build"
    done = subprocess.run([sys.executable, SETUP_PY, "-q", "build_py", "--build-lib", str(build)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (build / PTH_NAME).read_text() == pth_line()
    assert (build / "smdebug" / "capture" / "zero_code_change.py").is_file()
    probe = ("import site, sys; site.addsitedir(sys.argv[1]); "
             "print('smdebug.capture.zero_code_change' in sys.modules, sys.modules['smdebug.capture.zero_code_change'].is_installed()"
             " if 'smdebug.capture.zero_code_change' in sys.modules else None)")
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "USE_SMDEBUG")}
    for extra, expected in (({}, "False None"), ({"SMDEBUG_CONFIG_FILE_PATH": config[0]}, "True True"),
                            # USE_SMDEBUG is checked in the .pth line itself: nothing is imported.
                            ({"SMDEBUG_CONFIG_FILE_PATH": config[0], "USE_SMDEBUG": "0"}, "False None"),
                            ({"SMDEBUG_CONFIG_FILE_PATH": config[0], "USE_SMDEBUG": " False "}, "False None"),
                            ({"SMDEBUG_CONFIG_FILE_PATH": config[0], "USE_SMDEBUG": "1"}, "True True")):
        done = subprocess.run([sys.executable, "-c", probe, str(build)], env={**env, **extra},
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == expected, (extra, done.stdout, done.stderr[-2000:])


def test_instrument_and_uninstrument_in_process(tmp_path, monkeypatch, config):
    from smdebug.pytorch import _instrument

    path, out = config
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", path)
    global_hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = len(global_hooks)
    _instrument.instrument()
    _instrument.instrument()  # idempotent
    try:
        assert len(global_hooks) == before + 1
        model, criterion = make_model(), torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x, y = torch.randn(2, 1, 6, 6), torch.randint(0, 3, (2,))
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        hook = _instrument.current_hook()
        assert hook is not None and hook.is_registered(model) and hook.is_registered(criterion)
        assert len(global_hooks) == before  # removed once the second iteration started
    finally:
        _instrument.uninstrument()
    assert _instrument.current_hook() is None
    assert not model._forward_pre_hooks and not criterion._forward_hooks
    assert create_trial(out).steps() == [0, 2]


def test_second_run_into_the_same_out_dir_says_what_to_do_and_overwrite_replaces_it(tmp_path, config):
    path, out = config
    run_script(tmp_path, {"SMDEBUG_CONFIG_FILE_PATH": path})
    first = os.path.getmtime(os.path.join(out, "training_job_end.ts"))
    script = tmp_path / "train.py"
    env = {k: v for k, v in os.environ.items() if k != "USE_SMDEBUG"}
    env["SMDEBUG_CONFIG_FILE_PATH"] = path
    if installed_pth() is None:
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "boot")] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]  # training itself goes on
    assert "already holds a run" in done.stderr and '"overwrite": true' in done.stderr and path in done.stderr
    doc = json.loads(open(path).read())
    doc["HookParameters"]["overwrite"] = True
    with open(path, "w") as fh:
        json.dump(doc, fh)
    run_script(tmp_path, {"SMDEBUG_CONFIG_FILE_PATH": path})
    assert os.path.getmtime(os.path.join(out, "training_job_end.ts")) >= first
    assert create_trial(out).steps() == [0, 2, 4, 6, 8]


def test_a_bad_config_warns_once_naming_it_and_training_runs_uncaptured(tmp_path):
    out = tmp_path / "run"
    path = write_config(tmp_path / "hook.json", out, {"save_interval": "often"}, ["weights"])
    done = run_script_process(tmp_path, {"SMDEBUG_CONFIG_FILE_PATH": path})  # the policy of every framework
    warnings = [line for line in done.stderr.splitlines() if "zero code change" in line]
    assert len(warnings) == 1 and "save_interval" in warnings[0] and path in warnings[0], done.stderr[-2000:]
    assert not out.exists()

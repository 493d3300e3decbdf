"""What the trainer-integration tests (tests/lightning, tests/transformers) share:
running an unmodified script in a new interpreter, configured only by the environment."""
import ast
import json
import os
import site
import subprocess
import sys
import sysconfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTH_NAME = "smdebug_zero_code_change.pth"


def write_config(path, out_dir, hook_parameters=None, collections=()):
    """A JSON hook config at ``path``; ``collections`` are collection names."""
    path.write_text(json.dumps({"LocalPath": str(out_dir), "HookParameters": hook_parameters or {},
                                "CollectionConfigurations": [{"CollectionName": name} for name in collections]}))
    return str(path)


def _pth_line():
    tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PTH_LINE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("PTH_LINE not found in setup.py")


def _pth_installed():
    dirs = set(site.getsitepackages() + [sysconfig.get_paths()["purelib"]])
    return any(os.path.isfile(os.path.join(d, PTH_NAME)) for d in dirs)


def run_unmodified(tmp_path, script_text, env_overrides, timeout=240):
    """Run ``script_text`` (no smdebug in it) with the zero-code-change bootstrap in place.

    Returns (the JSON the script printed last, its stderr). The script must succeed:
    whatever smdebug does, training goes on.
    """
    script = tmp_path / "train.py"
    script.write_text(script_text)
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "USE_SMDEBUG")}
    env.update(env_overrides)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if not _pth_installed():  # a development install without the .pth: the same line, as sitecustomize
        boot = tmp_path / "boot"
        boot.mkdir(exist_ok=True)
        (boot / "sitecustomize.py").write_text(_pth_line())
        env["PYTHONPATH"] = os.pathsep.join([str(boot)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def hook_with_failing_backend(out_dir, **hook_args):
    """A PyTorch hook saving weights and gradients whose backend raises on every hand-over
    (an injected fault: the hook must disable itself with one warning, training goes on)."""
    from smdebug.pytorch import Hook

    hook = Hook(out_dir=str(out_dir), include_collections=["weights", "gradients"], **hook_args)

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    hook.session.backend.start_batch = broken
    return hook

"""``pip install -e .`` (a development install) gets zero code change too: the same ``.pth``
as a wheel install, which imports the bootstrap only when ``SMDEBUG_CONFIG_FILE_PATH`` is set
(and ``USE_SMDEBUG`` does not turn it off)."""
import os
import venv

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = "import sys; print('smdebug.capture.zero_code_change' in sys.modules)"


@pytest.mark.timeout(1200)
def test_editable_install_has_the_zero_code_change_pth(tmp_path, run):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    run(python, "-m", "pip", "install", "-q", "-e", REPO)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    pth = os.path.join(site, "smdebug_zero_code_change.pth")
    with open(pth, encoding="utf-8") as handle:
        assert "SMDEBUG_CONFIG_FILE_PATH" in handle.read()
    config = tmp_path / "config.json"
    config.write_text('{"LocalPath": "%s"}' % (tmp_path / "run"))
    base = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "USE_SMDEBUG")}
    for extra, expected in (({}, "False"), ({"SMDEBUG_CONFIG_FILE_PATH": str(config)}, "True"),
                            ({"SMDEBUG_CONFIG_FILE_PATH": str(config), "USE_SMDEBUG": "0"}, "False")):
        assert run(python, "-c", PROBE, env={**base, **extra}, cwd=str(tmp_path)).strip() == expected, extra

"""A plain ``pip install`` of the wheel must keep a numpy 1.x environment working.

mxnet 1.9.1 needs numpy<1.24 (it uses np.bool). Before ml_dtypes was capped below 0.6 (which
requires numpy>=2), installing smdebug-core there upgraded numpy to 2.x and broke mxnet.
This builds the wheel, installs it into a fresh venv that has mxnet 1.9.1 and numpy<1.24,
and checks numpy stayed 1.x and that both packages import and work. It uses the package
index (pip), like any install: a few minutes, most of it mxnet's download.
"""
import os
import sys
import venv

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHECK = """
import tempfile
import numpy, mxnet, ml_dtypes, smdebug as smd
hook = smd.Hook(out_dir=tempfile.mkdtemp() + "/run", save_all=True, save_config=smd.SaveConfig(save_interval=1))
hook.begin_step()
hook.record("w", mxnet.nd.ones((2, 3)).asnumpy())
hook.record("b", numpy.ones(3, ml_dtypes.bfloat16))
hook.close()
trial = smd.create_trial(hook.out_dir)
print(numpy.__version__, trial.tensor("w").value(0).sum(), trial.tensor("b").value(0).dtype)
"""


@pytest.mark.timeout(1800)
def test_wheel_keeps_numpy_1_beside_mxnet(tmp_path, run):
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), REPO)
    wheel = next((tmp_path / "dist").glob("smdebug_core-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    run(python, "-m", "pip", "install", "-q", "numpy<1.24", "mxnet==1.9.1")
    run(python, "-m", "pip", "install", "-q", str(wheel))  # a plain install, no pins
    numpy_version, total, dtype = run(python, "-c", CHECK, cwd=str(tmp_path)).split()
    assert numpy_version.startswith("1.") and int(numpy_version.split(".")[1]) < 24, numpy_version
    assert float(total) == 6.0 and dtype == "bfloat16"

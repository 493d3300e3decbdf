"""Analysis tests (DataFrames, plots, the ``smdebug`` command) on real runs."""
import numpy as np
import pytest


def write_numpy_run(out_dir, steps=30, workers=None):
    """A numpy-hook run: a weight saved as reductions (plain and abs, norms), a loss and a
    ``save_scalar`` learning rate; TRAIN steps then EVAL steps; TensorBoard on."""
    import smdebug as smd

    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), export_tensorboard=True,
                    include_collections=["weights", "losses"],
                    reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean"], abs_reductions=["max"],
                                                         norms=["l2"]))
    rng = np.random.default_rng(0)
    for step in range(steps):
        hook.set_mode(smd.modes.TRAIN if step < 2 * steps // 3 else smd.modes.EVAL)
        hook.begin_step()
        hook.save_tensor("dense.weight", rng.standard_normal((4, 3)).astype(np.float32), "weights")
        hook.save_tensor("loss", np.float32(1.0 / (step + 1)), "losses")
        hook.save_scalar("lr", 0.1 * step)
    hook.close()
    return out_dir


@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory):
    return write_numpy_run(str(tmp_path_factory.mktemp("analysis") / "run"))


@pytest.fixture(scope="module")
def numpy_run_1034(tmp_path_factory):
    """The same run in smdebug 1.0.34's files, for tests of how those are read."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")
        return write_numpy_run(str(tmp_path_factory.mktemp("analysis") / "run"))

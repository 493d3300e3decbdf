"""The ORIGINAL smdebug 1.0.34 reads the steps our flight recorder wrote (docs/flight_recorder.md):
they are ordinary steps, and the marker folder next to them does not disturb its reader."""
import numpy as np

import smdebug as smd
from compat_json import decode_array
from compat_runner import load_json, run_original

K = 6  # the step whose tensor turns infinite


def test_original_reads_the_flight_recorders_steps(original_python, tmp_path):
    run_dir = tmp_path / "run"
    hook = smd.Hook(out_dir=str(run_dir), save_config=smd.SaveConfig(save_interval=100), include_regex=["w"],
                    reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean"], save_raw_tensor=True),
                    flight_recorder=smd.FlightRecorder(steps=3, collections="default"))
    wrote = {}
    for step in range(9):
        hook.begin_step()
        with np.errstate(divide="ignore"):
            wrote[step] = np.arange(1.0, 5.0, dtype=np.float32) / (K - step)
        hook.record("w", wrote[step])
        hook.save_scalar("loss", float(step))
    hook.close()
    assert smd.create_trial(str(run_dir)).flight_recorder_trigger()["steps_written"] == [K - 2, K - 1, K]

    dump = tmp_path / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=tmp_path)
    got = load_json(dump)
    assert got["steps"]["GLOBAL"] == list(range(9))  # every step has its scalar
    w = got["tensors"]["w"]
    assert sorted(int(s) for s in w["at"]) == [0, K - 2, K - 1, K]
    for step in (0, K - 2, K - 1, K):
        item = w["at"][str(step)]["by_worker"]["worker_0"]
        np.testing.assert_array_equal(decode_array(item["value"]), wrote[step])
        reductions = {k: float(decode_array(v).reshape(-1)[0]) for k, v in item["reductions"].items()}
        np.testing.assert_allclose([reductions["min"], reductions["max"], reductions["mean"]],
                                   [wrote[step].min(), wrote[step].max(), wrote[step].astype(np.float64).mean()],
                                   rtol=1e-6)
    losses = got["tensors"]["scalar/loss"]["at"]
    assert [decode_array(losses[str(s)]["by_worker"]["worker_0"]["value"]).item() for s in range(9)] == \
        [float(s) for s in range(9)]
    assert all("error" not in f for f in got["event_files"].values())

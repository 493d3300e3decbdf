"""The check every DataFrame test makes: each row equals what the one-value API returns."""
import numpy as np


def assert_rows_equal_value_api(trial, df):
    """Every row of ``trial.to_dataframe()`` output equals ``value()`` (scalars) or
    ``reduction_value()`` (reductions) at its step and worker, bit for bit; returns the
    number of rows checked."""
    assert list(df.columns) == ["step", "mode", "mode_step", "worker", "tensor", "reduction", "value"]
    assert df["value"].dtype == np.float64
    checked = 0
    for row in df.itertuples(index=False):
        tensor = trial.tensor(row.tensor)
        assert trial.mode_modestep(row.step) == (trial.mode(row.step), row.mode_step)
        assert trial.mode(row.step).name == row.mode
        if row.reduction == "":
            value = tensor.value(row.step, worker=row.worker)
            assert value.size == 1
            expected = float(value.reshape(-1)[0])
        else:
            is_abs = row.reduction.startswith("abs_")
            op = row.reduction[4:] if is_abs else row.reduction
            expected = float(tensor.reduction_value(row.step, op, worker=row.worker, abs=is_abs))
        assert (expected == row.value) or (np.isnan(expected) and np.isnan(row.value)), \
            (row, expected)
        checked += 1
    return checked


def read_tensorboard(tb_dir, mode):
    """``({scalar tag: [(step, value)]}, [histogram tags])`` of one mode's TensorBoard run, as
    TensorBoard's own EventAccumulator reads it (in a child without TensorFlow, so that it
    uses its own reader and stays fast)."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import json, sys
        sys.modules["tensorflow"] = None
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "histograms": 0})
        acc.Reload()
        tags = acc.Tags()
        print(json.dumps([{t: [(s.step, s.value) for s in acc.Scalars(t)] for t in tags["scalars"]},
                          sorted(tags["histograms"])]))
    """)
    out = subprocess.run([sys.executable, "-c", script, f"{tb_dir}/{mode}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    scalars, histograms = json.loads(out.stdout.strip().splitlines()[-1])
    return scalars, histograms

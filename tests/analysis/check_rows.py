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

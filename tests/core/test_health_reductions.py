"""The health reductions (nonfinite, zero_fraction, kurtosis, overflow_<t>, underflow_<t>):
the reference in smdebug.reductions against independent computations (casts with
ml_dtypes, scipy-free moment formulas) on constructed values, the partials path every
backend uses, their combination across pieces (sharded tensors), and the config spellings."""
import json

import ml_dtypes
import numpy as np
import pytest

import smdebug as smd
from smdebug import reductions as reference
from smdebug.exceptions import ConfigError
from smdebug.reduction_columns import Segments
from smdebug.reduction_config import ReductionConfig

TYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
         "fp8_e5m2": ml_dtypes.float8_e5m2}


def constructed(dtype=np.float64):
    """Values at and just past every type's limits, subnormals, zeros of both signs, NaN, ±Inf."""
    values = [0.0, -0.0, 1.0, -2.5, 3e-3, np.nan, np.inf, -np.inf, 7.0]
    for t in TYPES.values():
        info = ml_dtypes.finfo(t)
        largest, tiny = float(info.max), float(info.smallest_subnormal)
        values += [largest, -largest, np.nextafter(dtype(largest), dtype(np.inf)),
                   -np.nextafter(dtype(largest), dtype(np.inf)),
                   tiny, tiny / 2, -tiny / 2, np.nextafter(dtype(tiny / 2), dtype(1)), tiny / 4]
    return np.array(values, dtype=dtype)


def _independent(x: np.ndarray, op: str) -> float:
    source_dtype = x.dtype
    x = x.astype(np.float64)
    finite = x[np.isfinite(x)]
    if op == "nonfinite":
        return float(np.isnan(x).sum() + np.isinf(x).sum())
    if op == "zero_fraction":
        return float(sum(1 for v in x.tolist() if v == 0)) / x.size
    if op == "kurtosis":
        mean = sum(finite.tolist()) / finite.size
        m2 = sum((v - mean) ** 2 for v in finite.tolist()) / finite.size
        m4 = sum((v - mean) ** 4 for v in finite.tolist()) / finite.size
        return m4 / m2 ** 2
    kind, name = op.split("_", 1)
    t = TYPES[name]
    with np.errstate(all="ignore"):
        if kind == "overflow":  # strictly above the largest finite value
            return float(np.mean(np.abs(finite) > float(ml_dtypes.finfo(t).max)))
        nonzero = finite[finite != 0]
        if source_dtype == np.float32:  # the cast itself rounds to zero
            return float(np.mean(nonzero.astype(np.float32).astype(t).astype(np.float64) == 0))
        # ml_dtypes casts float64 through float32 (rounding twice): round x / smallest subnormal
        # (exact, a power of two) to the nearest integer, ties to even, instead
        return float(np.mean(np.rint(np.abs(nonzero) / float(ml_dtypes.finfo(t).smallest_subnormal)) == 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", reference.HEALTH_REDUCTIONS)
def test_each_health_reduction_equals_an_independent_computation(op, dtype):
    x = constructed(dtype)
    got = float(reference.reduce(x, op))
    np.testing.assert_allclose(got, _independent(x, op), rtol=1e-12, err_msg=op)


def test_the_constructed_values_reach_every_limit():
    x = constructed(np.float64)
    for name in TYPES:
        assert 0 < reference.reduce(x, f"overflow_{name}") < 1, name
        assert 0 < reference.reduce(x, f"underflow_{name}") < 1, name
    assert reference.reduce(x, "nonfinite") == 3
    # a normal distribution's kurtosis is 3, not 0 (not excess kurtosis)
    normal = np.random.default_rng(0).standard_normal(200_000)
    assert abs(float(reference.reduce(normal, "kurtosis")) - 3) < 0.05


def test_edge_cases_give_nan_not_errors():
    assert np.isnan(reference.reduce(np.array([np.nan, np.inf]), "kurtosis"))
    assert np.isnan(reference.reduce(np.array([2.0, 2.0]), "kurtosis"))
    assert np.isnan(reference.reduce(np.array([np.nan]), "overflow_fp16"))
    assert np.isnan(reference.reduce(np.array([0.0, np.inf]), "underflow_bf16"))
    assert reference.reduce(np.array([np.nan, 0.0]), "zero_fraction") == 0.5
    # integers: nothing non-finite, zeros counted
    assert reference.reduce(np.array([0, 1, 70000]), "overflow_fp16") == pytest.approx(1 / 3)


def _segments_partials(x, sizes, keys, host=False):
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
    segments = Segments(np.asarray(sizes, np.float64), lambda a: np.add.reduceat(a.astype(np.float64), starts),
                        lambda v: np.repeat(v, sizes), np)
    return reference.health_partials(x, reference.health_columns(keys, combinable=True), segments, host=host)


def _finite_pieces():
    """Every element finite, none 0: the host path settles counts from the extremes."""
    rng = np.random.default_rng(2)
    limits = constructed()
    return [limits[np.isfinite(limits) & (limits != 0)], 1e-9 * rng.standard_normal(30),
            np.array([3e-8, 2.0 ** -25, 7e-6]), rng.standard_normal(50)]


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("case", ["limits, NaN and zeros", "finite, no zero", "finite and zeros", "small and finite"])
def test_partials_of_segments_and_of_pieces_finish_as_the_reference(case, host):
    rng = np.random.default_rng(1)
    pieces = {"limits, NaN and zeros": [constructed(), 5 + rng.standard_normal(40) ** 3, np.array([np.nan]),
                                        np.array([4.0, 4.0, 9.0]), np.array([-0.0])],
              "finite, no zero": _finite_pieces(),
              "finite and zeros": [np.concatenate([piece, [0.0, -0.0]]) for piece in _finite_pieces()]
              + [np.zeros(3), np.array([0.0, 1e-30])],
              "small and finite": [rng.uniform(0.5, 2.0, 20), rng.uniform(-1, 1, 30)]}[case]
    whole = np.concatenate(pieces)
    keys = tuple((op, is_abs) for op in reference.HEALTH_REDUCTIONS for is_abs in (False, True))
    columns = reference.health_columns(keys, combinable=True)
    sizes = [p.size for p in pieces]
    with np.errstate(all="ignore"):
        partials = _segments_partials(np.concatenate(pieces), sizes, keys, host)
        for i, piece in enumerate(pieces):  # segments: each piece's own reductions
            for op, is_abs in keys:
                np.testing.assert_allclose(reference.finish_health(partials, op, is_abs)[i],
                                           reference.reduce(piece, op, is_abs), rtol=1e-10, equal_nan=True)
        rows = np.stack([np.asarray(partials[c], np.float64) for c in columns], axis=1)
        combined = reference.combine_health_partials(rows, columns)  # pieces of one tensor
        whole_partials = {c: combined[j] for j, c in enumerate(columns)}
        for op, is_abs in keys:
            np.testing.assert_allclose(reference.finish_health(whole_partials, op, is_abs),
                                       reference.reduce(whole, op, is_abs), rtol=1e-10, equal_nan=True,
                                       err_msg=f"{op} abs={is_abs}")


def test_config_spellings_and_the_collections_file_1034_reads():
    config = ReductionConfig(reductions=["max", "kurtosis", "overflow_fp8_e4m3"], abs_reductions=["zero_fraction"],
                             norms=["l2"])
    doc = config.to_json_dict()
    assert doc["reductions"] == "max,l2_norm"
    assert doc["extra_reductions"] == "kurtosis,overflow_fp8_e4m3,abs_zero_fraction"
    assert ReductionConfig.from_json_dict(doc) == config
    parsed = ReductionConfig.from_string("nonfinite, underflow_bf16,abs_kurtosis")
    assert parsed.all_reductions() == [("nonfinite", False), ("underflow_bf16", False), ("kurtosis", True)]
    with pytest.raises(ConfigError, match="overflow_fp32"):
        ReductionConfig(reductions=["overflow_fp32"])


def test_the_json_config_reductions_string(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"LocalPath": str(tmp_path / "run"), "CollectionConfigurations": [
        {"CollectionName": "weights", "CollectionParameters": {"reductions": "nonfinite,kurtosis,overflow_fp16"}}]}))
    hook = smd.Hook.create_from_json_file(str(path))
    assert hook.get_collection("weights").reduction_config.reductions == ["nonfinite", "kurtosis", "overflow_fp16"]
    hook.close()


def test_a_hook_saves_them_and_the_trial_reads_them(tmp_path):
    out_dir = str(tmp_path / "run")
    keys = ["nonfinite", "zero_fraction", "kurtosis", "overflow_fp16", "underflow_fp8_e5m2"]
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.get_collection("weights").include("^w$")
    hook.get_collection("weights").reduction_config = ReductionConfig(reductions=keys)
    x = constructed(np.float32)
    hook.begin_step()
    hook.record("w", x)
    hook.close()
    from smdebug.trials import create_trial

    tensor = create_trial(out_dir, wait_timeout=1).tensor("w")
    for op in keys:
        np.testing.assert_allclose(tensor.reduction_value(0, op), reference.reduce(x, op), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_smallest_nonzero_magnitude(dtype):
    cases = [([0, 3, 0, 2, 5], 2), ([0, 0], np.inf), ([7], 7)]
    if dtype != np.int64:
        tiny = float(np.finfo(dtype).smallest_subnormal)
        cases += [([0.0, np.nan, 0.5, np.inf], 0.5), ([np.nan, 0.0], np.inf), ([tiny, 0.0, 1.0], tiny)]
    for values, want in cases:
        assert reference.smallest_nonzero(np.abs(np.array(values, dtype=dtype))) == want, values

"""MXNetBackend: device reductions equal smdebug.reductions; one host transfer per group."""
import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from smdebug import reductions as reference  # noqa: E402
from smdebug.capture.backend import Request  # noqa: E402
from smdebug.mxnet.backend import MXNetBackend  # noqa: E402

ALL_REDUCTIONS = tuple((op, is_abs) for op in ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2")
                       for is_abs in (False, True))


def arrays():
    rng = np.random.default_rng(1)
    return {
        "scalar": np.array([3.5], np.float32),
        "vec7": rng.standard_normal(7).astype(np.float32),
        "vec8": rng.standard_normal(8).astype(np.float32),
        "vec9": rng.standard_normal(9).astype(np.float32),  # same size class as 16 below
        "mat4x4": rng.standard_normal((4, 4)).astype(np.float32),
        "conv": (rng.standard_normal((3, 2, 5, 5)) * 10 + 4).astype(np.float32),
        "big": rng.standard_normal(5000).astype(np.float32),
        "half": rng.standard_normal((6, 3)).astype(np.float16),
        "double": rng.standard_normal(33),
        "ints": rng.integers(-50, 50, size=(4, 6)).astype(np.int32),
        "int64": rng.integers(0, 9, size=11).astype(np.int64),
        "prod_safe": rng.uniform(0.9, 1.1, 40).astype(np.float32),
    }


def materialize(values, reductions=ALL_REDUCTIONS, raw=True, shape=False):
    backend = MXNetBackend()
    requests = [Request(name, backend.snapshot(mx.nd.array(v, dtype=v.dtype), True), raw=raw, shape=shape,
                        reductions=reductions) for name, v in values.items()]
    return dict(zip(values, backend.materialize(requests)))


def test_every_reduction_matches_the_reference():
    values = arrays()
    results = materialize(values)
    for name, value in values.items():
        result = results[name]
        assert list(result.reductions) == list(ALL_REDUCTIONS), name
        for (op, is_abs), got in result.reductions.items():
            expected = reference.reduce(value, op, is_abs)
            assert got.dtype == np.float64 and got.shape == ()
            np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-9, err_msg=f"{name} {op} abs={is_abs}")
        np.testing.assert_array_equal(result.raw, value)
        assert result.raw.dtype == value.dtype


def test_nan_and_inf_propagate_like_numpy():
    values = {"nan_first": np.array([np.nan, 1, 2], np.float32), "nan_last": np.array([1, 2, np.nan], np.float32),
              "inf": np.array([1, np.inf, -np.inf, 2], np.float32), "clean": np.array([4, 5], np.float32)}
    results = materialize(values, reductions=(("min", False), ("max", False), ("sum", False), ("l2", False)))
    for name, value in values.items():
        for key, got in results[name].reductions.items():
            np.testing.assert_equal(got, reference.reduce(value, *key), err_msg=f"{name} {key}")


def test_empty_tensors_get_no_reductions_and_shapes_need_no_copy():
    backend = MXNetBackend()
    empty = mx.nd.array(np.zeros((0, 3), np.float32))
    full = mx.nd.ones((2, 3))
    out = backend.materialize([
        Request("empty", backend.snapshot(empty, True), raw=True, shape=False, reductions=(("mean", False),)),
        Request("shape_only", backend.snapshot(full, False), raw=False, shape=True, reductions=()),
    ])
    assert out[0].reductions == {} and out[0].raw.shape == (0, 3)
    assert out[1].raw is None and out[1].shape == (2, 3)


def test_median_falls_back_to_the_host_reference():
    value = np.arange(10, dtype=np.float32)[::-1].copy()
    result = materialize({"v": value}, reductions=(("median", False), ("max", False)), raw=False)["v"]
    assert result.raw is None
    assert result.reductions[("median", False)] == pytest.approx(4.5)
    assert result.reductions[("max", False)] == pytest.approx(9.0)


def test_snapshot_is_unaffected_by_later_in_place_updates():
    backend = MXNetBackend()
    weight = mx.nd.ones((3,))
    snap = backend.snapshot(weight, True)
    weight[:] = 5  # what an optimizer update does
    out = backend.materialize([Request("w", snap, raw=True, shape=False, reductions=(("sum", False),))])[0]
    np.testing.assert_array_equal(out.raw, np.ones(3, np.float32))
    assert out.reductions[("sum", False)] == 3.0


def test_one_host_transfer_per_dtype_and_one_for_all_reductions(monkeypatch):
    transfers = []
    original = mx.nd.NDArray.asnumpy

    def counting(self):
        transfers.append(self.dtype)
        return original(self)

    values = arrays()
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", counting)
    materialize(values)
    raw_dtypes = {np.dtype(v.dtype) for v in values.values()}
    assert len(transfers) == len(raw_dtypes) + 1
    assert sorted(map(str, map(np.dtype, transfers))).count("float64") == 2  # the float64 raws + the reductions


def test_accepts_nd_and_np_arrays_only():
    backend = MXNetBackend()
    assert backend.accepts(mx.nd.ones(2)) and backend.accepts(mx.np.ones(2))
    assert not backend.accepts(np.ones(2)) and not backend.accepts(3.0)
    snap = backend.snapshot(mx.np.arange(4).reshape(2, 2), True)
    out = backend.materialize([Request("np", snap, raw=True, shape=True, reductions=(("l1", False),))])[0]
    np.testing.assert_array_equal(out.raw, np.arange(4, dtype=np.float32).reshape(2, 2))
    assert out.reductions[("l1", False)] == 6.0


def test_arrays_on_several_contexts_are_grouped_per_context(monkeypatch):
    transfers = []
    original = mx.nd.NDArray.asnumpy
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", lambda self: transfers.append(self.context) or original(self))
    backend = MXNetBackend()
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(n).astype(np.float32) for n in (5, 6, 300)]
    contexts = [mx.cpu(0), mx.cpu(1), mx.cpu(1)]
    requests = [Request(str(i), backend.snapshot(mx.nd.array(v, ctx=c), True), raw=True, shape=False,
                        reductions=(("std", False), ("max", True)))
                for i, (v, c) in enumerate(zip(values, contexts))]
    for value, result in zip(values, backend.materialize(requests)):
        np.testing.assert_array_equal(result.raw, value)
        np.testing.assert_allclose(result.reductions[("std", False)], np.std(value.astype(np.float64)), rtol=2e-6)
        np.testing.assert_allclose(result.reductions[("max", True)], np.abs(value).max(), rtol=1e-7)
    assert sorted(map(str, transfers)) == ["cpu(0)", "cpu(0)", "cpu(1)", "cpu(1)"]  # raw + reductions, each

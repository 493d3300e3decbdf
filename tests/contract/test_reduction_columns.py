"""Every backend only produces partial columns (smdebug.reduction_columns) and finishes them with
the one finisher; here each installed backend, through each of its strategies, is checked against
the numpy reference definitions (smdebug.reductions) on the same inputs: NaN, infinities, zeros,
one-element tensors, float32 values whose 4th powers leave float32's range (both ways), and
pieces of a tensor (an empty one among them) combined exactly.
"""
import math

import numpy as np
import pytest

from smdebug import reduction_columns as columns
from smdebug import reductions as reference
from smdebug.capture.backend import NumpyBackend, Request

KEYS = tuple((op, is_abs) for is_abs in (False, True) for op in reference.REDUCTIONS + reference.NORMS)
#: Reductions combined exactly across pieces (prod and median are not).
COMBINABLE = tuple(k for k in KEYS if k[0] not in ("prod", "median"))


def _inputs():
    rng = np.random.default_rng(11)
    special = rng.standard_normal(40).astype(np.float32)
    special[[3, 9, 17]] = [np.nan, np.inf, -np.inf]
    special[20:25] = 0.0
    return {
        "f32": rng.standard_normal((4, 9)).astype(np.float32),
        "f64": rng.standard_normal(50) * 3 + 2,
        "nan inf zeros": special,
        "only inf": np.array([np.inf, -np.inf, 1.0], dtype=np.float32),
        "one element": np.array([-2.5], dtype=np.float32),
        "one nan": np.array([np.nan], dtype=np.float32),
        # x**4 overflows float32 (1e48), and underflows it (1e-48): kurtosis must not
        "4th powers over float32": (rng.standard_normal(70_000) * 1e12).astype(np.float32),
        "4th powers under float32": (rng.standard_normal(70_000) * 1e-12).astype(np.float32),
        "big, offset": (rng.standard_normal(70_000) * 1e-3 + 100).astype(np.float32),
        "i32": np.arange(-6, 30, dtype=np.int32),
    }


def _rtol(name, array):
    if name == "big, offset":  # float32 kernels (one tensor's, TF's big ones): mean^2 / var = 1e10
        return 1e-4
    return 2e-5 if array.dtype != np.float64 else 1e-9


def _check(name, array, keys, got):
    with np.errstate(all="ignore"):
        want = reference.reduce_many(array, keys)
    for key, expected in zip(keys, want):
        np.testing.assert_allclose(np.float64(got[key]), expected, rtol=_rtol(name, array), atol=1e-30, equal_nan=True,
                                   err_msg=f"{name}: {key}")


# --------------------------------------------------------------------- the core's own producers
def test_flat_and_value_columns_finish_as_the_reference():
    inputs = _inputs()
    arrays = [np.asarray(a, np.float64).reshape(-1) for a in inputs.values()]
    plan = columns.segments(np.array([a.size for a in arrays], np.int64))
    table = columns.finish_table(columns.flat_columns(np.concatenate(arrays), plan, columns.columns_for(KEYS)), KEYS)
    for (name, array), row in zip(inputs.items(), table):
        _check(name, array, KEYS, dict(zip(KEYS, row)))
    for value in [2.5, -0.0, np.nan, np.inf, 7e4, 1e-30]:
        with np.errstate(all="ignore"):
            row = columns.finish(columns.value_columns(value, columns.columns_for(KEYS)), KEYS, math.sqrt)
        _check(repr(value), np.array([value]), KEYS, dict(zip(KEYS, row)))


def test_columns_of_pieces_combine_into_the_whole_tensors_columns():
    """Pieces of every input (one of them empty), their columns combined, then finished."""
    needed = columns.columns_for(COMBINABLE, combinable=True)
    for name, array in _inputs().items():
        flat = np.asarray(array, np.float64).reshape(-1)
        pieces = [flat[: len(flat) // 3], flat[:0], flat[len(flat) // 3:]]
        rows = []
        for piece in pieces:
            if piece.size:
                cols = columns.flat_columns(piece, columns.segments(np.array([piece.size], np.int64)), needed)
            else:  # an empty piece: the neutral elements
                cols = {c: np.array([{"min": np.inf, "max": -np.inf, "min_abs": np.inf, "max_abs": -np.inf}.get(c, 0.0)])
                        for c in needed}
                cols["var"] = cols.get("var", np.zeros(1))
            rows.append(columns.to_sums(cols))
        whole = columns.to_variances(columns.combine({c: np.stack([r[c] for r in rows]) for c in rows[0]}))
        _check(name, array, COMBINABLE, dict(zip(COMBINABLE, columns.finish_table(whole, COMBINABLE)[0])))


def test_one_finisher():
    """No reduction formula is spelled outside the finisher: unknown names fail there."""
    with pytest.raises(ValueError, match="unknown reduction"):
        columns.columns_for((("mode", False),))
    assert set(columns.columns_for(KEYS)) <= set(columns.COLUMNS)


# --------------------------------------------------------------------- each backend, each strategy
def test_numpy_backend():
    inputs = _inputs()
    results = NumpyBackend().materialize([Request(n, a, False, False, KEYS) for n, a in inputs.items()])
    for (name, array), result in zip(inputs.items(), results):
        _check(name, array, KEYS, result.reductions)


@pytest.fixture
def torch_backend():
    pytest.importorskip("torch")
    from smdebug.pytorch import backend

    return backend


@pytest.mark.parametrize("strategy", ["rows", "batch", "segments", "device"])
def test_torch_strategies(torch_backend, strategy, monkeypatch):
    import torch

    backend = torch_backend.TorchBackend()
    inputs = _inputs()
    if strategy == "device":  # the accelerators' path (segment ops, one tensor's kernels) on CPU tensors
        monkeypatch.setattr(torch_backend, "CPU_ROWS", False)
    if strategy in ("rows", "device"):
        results = backend.materialize([Request(n, torch.from_numpy(a.copy()), False, False, KEYS)
                                       for n, a in inputs.items()])
        got = [r.reductions for r in results]
    elif strategy == "batch":  # one-element tensors: the single-values strategy
        got = []
        for name, array in inputs.items():
            result = backend.finish_batch(backend.start_batch([torch.from_numpy(array.copy())], KEYS, False))
            got.append(dict(zip(KEYS, result.reductions[0])))
    else:  # small float tensors of one dtype: segments of one flat copy
        small = {n: a for n, a in inputs.items() if a.size < 1000 and a.dtype == np.float32}
        result = backend.finish_batch(backend.start_batch([torch.from_numpy(a.copy()) for a in small.values()],
                                                          KEYS, False))
        inputs, got = small, [dict(zip(KEYS, row)) for row in result.reductions]
    for (name, array), reductions in zip(inputs.items(), got):
        _check(name, array, KEYS, reductions)


def test_torch_partial_columns_of_shards_combine_as_the_reference(torch_backend):
    import torch

    from smdebug.pytorch import sharded

    backend = torch_backend.TorchBackend()
    exact = tuple(k for k in COMBINABLE if k[0] in sharded.EXACT_REDUCTIONS)
    for name, array in _inputs().items():
        full = torch.from_numpy(array.copy()).reshape(-1)
        pieces = [full[:5], full[5:5], full[5:]]  # an empty shard among them
        gathered = np.stack([sharded.shard_partials([p], backend, sharded.columns_needed(exact)) for p in pieces])
        row = sharded.combine_partials(gathered)
        _check(name, array, exact, dict(zip(exact, sharded.reductions_table(row, exact)[0])))


def test_torch_partial_columns_of_many_tensors_at_once_match_the_reference(torch_backend):
    """One call for a whole batch of shards (how a sharded model's pieces are read): mixed
    dtypes and sizes, so same-shape pieces are stacked in capped chunks and large ones read
    where they lie; each row must finish to the reference reductions of its tensor."""
    import torch

    from smdebug.pytorch import sharded

    backend = torch_backend.TorchBackend()
    exact = tuple(k for k in COMBINABLE if k[0] in sharded.EXACT_REDUCTIONS)
    inputs = list(_inputs().items())
    inputs += [(f"{name}, again", array * 2) for name, array in inputs]  # same shapes: stacked together
    partials = sharded.shard_partials([torch.from_numpy(a.copy()) for _, a in inputs], backend,
                                      sharded.columns_needed(exact))
    table = sharded.reductions_table(sharded.combine_partials(partials[None]), exact)
    for (name, array), row in zip(inputs, table):
        _check(name, array, exact, dict(zip(exact, row)))


def test_tensorflow_segments_and_large_tensors():
    tf = pytest.importorskip("tensorflow")
    from smdebug.tensorflow.backend import TFBackend

    inputs = _inputs()
    results = TFBackend().materialize([Request(n, tf.constant(a), False, False, KEYS) for n, a in inputs.items()])
    for (name, array), result in zip(inputs.items(), results):
        _check(name, array, KEYS, result.reductions)


def test_mxnet_rows_and_host_fallback():
    mx = pytest.importorskip("mxnet")
    from smdebug.mxnet.backend import MXNetBackend

    inputs = _inputs()
    results = MXNetBackend().materialize([Request(n, mx.nd.array(a, dtype=a.dtype), False, False, KEYS)
                                          for n, a in inputs.items()])
    for (name, array), result in zip(inputs.items(), results):
        _check(name, array, KEYS, result.reductions)

"""TorchBackend: batched reductions equal the numpy reference; raw values are exact."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from smdebug import reductions  # noqa: E402
from smdebug.capture.backend import Request  # noqa: E402
from smdebug.pytorch import backend as torch_backend  # noqa: E402
from smdebug.pytorch import host_reductions  # noqa: E402
from smdebug.pytorch import row_health  # noqa: E402
from smdebug.pytorch.backend import TorchBackend  # noqa: E402

OPS = ("min", "max", "mean", "std", "variance", "sum", "prod", "median", "l1", "l2")
ALL_KEYS = tuple(itertools.product(OPS, (False, True)))


def sample_tensors():
    gen = torch.Generator().manual_seed(1)
    return [
        torch.randn(3, 4, generator=gen),  # a matrix: norms are of the flattened tensor
        torch.randn(2, 3, 2, 2, generator=gen) * 10,  # rank 4
        torch.randn(9, generator=gen, dtype=torch.float64) + 100,  # float64, large mean
        torch.tensor(2.5),  # 0-d
        torch.tensor([1.5, -0.25, 3.0], dtype=torch.bfloat16),
        torch.tensor([[0.5, -2.0], [4.0, 1.0]], dtype=torch.float16),
        torch.arange(-3, 5, dtype=torch.int64).reshape(2, 4),
        torch.tensor([True, False, True]),
        torch.tensor([1 + 2j, -3 - 1j], dtype=torch.complex64),
        torch.randn(10000, generator=gen),  # above the CPU batching threshold: reduced in place
        torch.tensor([1.0, float("nan"), 2.0]),
        torch.tensor([float("inf"), 1.0, -2.0]),
    ]


def as_numpy(tensor):
    t = tensor.detach()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def assert_matches(result, tensor):
    array = as_numpy(tensor)
    expected = reductions.reduce_many(array, ALL_KEYS)
    magnitude = np.abs(reductions.as_float_array(array))
    scale = float(magnitude[np.isfinite(magnitude)].max())
    for key, want in zip(ALL_KEYS, expected):
        got = result.reductions[key]
        assert got.dtype == np.float64, key
        # float32 tolerance: relative, plus an absolute term for results near 0 (sums that cancel).
        atol = 0 if key[0] == "prod" else 2e-6 * (1 + scale) * (array.size if key[0] in ("sum", "l1") else 1)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=atol, equal_nan=True,
                                   err_msg=f"{key} of {tensor.dtype} {tuple(tensor.shape)}")


def requests_for(tensors, raw=False, keys=ALL_KEYS):
    backend = TorchBackend()
    return backend, [Request(f"t{i}", backend.snapshot(t, True), raw=raw, shape=True, reductions=keys)
                     for i, t in enumerate(tensors)]


@pytest.fixture(params=["rows", "device"], autouse=True)
def segment_ops(request, monkeypatch):
    """Every test runs with both implementations of the batched reductions: the CPU's rows
    of stacked tensors, and the accelerators' segment ops, here run on CPU tensors."""
    if request.param == "device":
        monkeypatch.setattr(torch_backend, "CPU_ROWS", False)
    return request.param


def test_every_reduction_of_every_dtype_equals_numpy():
    tensors = sample_tensors()
    backend, requests = requests_for(tensors)
    results = backend.materialize(requests)
    for tensor, result in zip(tensors, results):
        assert result.shape == tuple(tensor.shape)
        assert result.raw is None
        assert_matches(result, tensor)


def test_the_cpu_rows_and_the_device_paths_agree(monkeypatch):
    tensors = sample_tensors()
    backend, requests = requests_for(tensors)
    monkeypatch.setattr(torch_backend, "CPU_ROWS", True)
    rows = backend.materialize(requests)
    monkeypatch.setattr(torch_backend, "CPU_ROWS", False)
    monkeypatch.setitem(torch_backend.BATCH_MAX_NUMEL, "cpu", 0)  # every tensor reduced in place
    backend, requests = requests_for(tensors)
    in_place = backend.materialize(requests)
    for a, b, tensor in zip(rows, in_place, tensors):
        for key in ALL_KEYS:
            np.testing.assert_allclose(a.reductions[key], b.reductions[key], rtol=2e-6, atol=1e-6, equal_nan=True,
                                       err_msg=f"{key} of {tensor.dtype}")


def test_small_chunks_still_match(monkeypatch):
    monkeypatch.setattr(torch_backend, "CHUNK_MAX_NUMEL", 20)  # forces several concatenation buffers
    tensors = sample_tensors()[:9]
    backend, requests = requests_for(tensors)
    for tensor, result in zip(tensors, backend.materialize(requests)):
        assert_matches(result, tensor)


def test_one_host_transfer_and_one_kernel_per_reduction_kind(monkeypatch, segment_ops):
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(5, 7, generator=gen) for _ in range(40)]
    backend, requests = requests_for(tensors)
    for r in requests:
        r.reductions = (("min", False), ("max", False), ("l2", False), ("mean", True))

    calls = {"cpu": 0, "segment_reduce": 0, "rows": 0, "segments": 0}
    real_cpu, real_segment, real_rows = torch.Tensor.cpu, torch.segment_reduce, torch_backend.reduce_rows
    real_segments = host_reductions.reduce_segments

    def counting_cpu(self, *args, **kwargs):
        calls["cpu"] += 1
        return real_cpu(self, *args, **kwargs)

    def counting_segment(*args, **kwargs):
        calls["segment_reduce"] += 1
        return real_segment(*args, **kwargs)

    def counting_rows(*args, **kwargs):
        calls["rows"] += 1
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    monkeypatch.setattr(torch, "segment_reduce", counting_segment)
    def counting_segments(*args, **kwargs):
        calls["segments"] += 1
        return real_segments(*args, **kwargs)

    monkeypatch.setattr(torch_backend, "reduce_rows", counting_rows)
    monkeypatch.setattr(host_reductions, "reduce_segments", counting_segments)
    results = backend.materialize(requests)
    assert calls["cpu"] == 1
    if segment_ops == "device":
        # min, max, sum of squares (l2) and sum of |x| (abs mean): 4 kernels for 40 tensors.
        assert (calls["segment_reduce"], calls["rows"]) == (4, 0)
    else:  # 40 small tensors: one flat copy reduced in segments (host_reductions.reduce_segments), one call
        assert (calls["segment_reduce"], calls["rows"], calls["segments"]) == (0, 0, 1)
    for tensor, result in zip(tensors, results):
        np.testing.assert_allclose(result.reductions[("l2", False)], np.linalg.norm(tensor.numpy().ravel()),
                                   rtol=1e-6)


def test_raw_values_are_exact_including_bfloat16_and_float16():
    bf16 = torch.tensor([[1.0078125, -3.3e-3], [65280.0, float("nan")]], dtype=torch.bfloat16)
    f16 = torch.tensor([1e-4, -65504.0, 0.333], dtype=torch.float16)
    i8 = torch.tensor([-128, 5, 127], dtype=torch.int8)
    backend = TorchBackend()
    requests = [Request(n, backend.snapshot(t, True), raw=True, shape=False, reductions=())
                for n, t in (("bf16", bf16), ("f16", f16), ("i8", i8))]
    bf16_out, f16_out, i8_out = (m.raw for m in backend.materialize(requests))
    assert bf16_out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert bf16_out.view(np.int16).tobytes() == bf16.view(torch.int16).numpy().tobytes()
    assert f16_out.dtype == np.float16 and f16_out.tobytes() == f16.numpy().tobytes()
    assert i8_out.dtype == np.int8 and i8_out.tolist() == [-128, 5, 127]


def test_snapshot_is_immune_to_in_place_updates():
    t = torch.ones(3, requires_grad=True)
    backend = TorchBackend()
    snap = backend.snapshot(t, True)
    with torch.no_grad():
        t.add_(5)
    (result,) = backend.materialize([Request("t", snap, raw=True, shape=False, reductions=(("sum", False),))])
    assert result.raw.tolist() == [1.0, 1.0, 1.0]
    assert float(result.reductions[("sum", False)]) == 3.0


def test_capture_reduces_now_and_copies_only_raw_values():
    weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    bias = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    backend = TorchBackend()
    snaps = backend.capture([(weight, False, (("max", False), ("l1", False))), (bias, True, ())])
    assert not snaps[0].owned and snaps[0].reduced is not None
    assert snaps[1].owned and snaps[1].tensor.data_ptr() != bias.data_ptr()
    with torch.no_grad():  # the optimizer step that follows a capture
        weight.mul_(10)
        bias.zero_()
    wres, bres = backend.materialize([
        Request("w", snaps[0], raw=False, shape=False, reductions=(("max", False), ("l1", False))),
        Request("b", snaps[1], raw=True, shape=False, reductions=()),
    ])
    assert float(wres.reductions[("max", False)]) == 5.0 and float(wres.reductions[("l1", False)]) == 15.0
    assert bres.raw.tolist() == [1.0, -1.0]


def test_empty_tensor_has_shape_but_no_reductions():
    backend = TorchBackend()
    (snap,) = backend.capture([(torch.zeros(0, 2), True, (("max", False),))])
    (captured,) = backend.materialize([Request("c", snap, raw=True, shape=False, reductions=(("max", False),))])
    assert captured.reductions == {} and captured.raw.shape == (0, 2)
    (result,) = backend.materialize([Request("e", backend.snapshot(torch.zeros(0, 3), True), raw=True, shape=True,
                                             reductions=(("mean", False),))])
    assert result.shape == (0, 3) and result.reductions == {} and result.raw.shape == (0, 3)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_reductions_equal_numpy_with_one_transfer(monkeypatch):
    # The last one is above BATCH_MAX_NUMEL["cuda"]: reduced in place.
    tensors = [t for t in sample_tensors() if t.dtype != torch.complex64] + [torch.randn(5_000_000)]
    on_device = [t.cuda() for t in tensors]
    backend, requests = requests_for(on_device, raw=True)
    calls = {"cpu": 0}
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self, *args, **kwargs):
        calls["cpu"] += 1
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    results = backend.materialize(requests)
    assert calls["cpu"] == 1  # every reduction of every tensor crosses in one copy
    monkeypatch.undo()
    for tensor, result in zip(tensors, results):
        assert_matches(result, tensor)
        if tensor.dtype == torch.bfloat16:
            assert result.raw.view(np.int16).tobytes() == tensor.view(torch.int16).numpy().tobytes()
        else:
            np.testing.assert_array_equal(result.raw, tensor.numpy())


@cuda
def test_cuda_capture_copies_raw_values_before_the_update():
    weight = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
    expected = weight.detach().cpu().numpy().copy()
    backend = TorchBackend()
    (snap,) = backend.capture([(weight, True, (("l2", False),))])
    with torch.no_grad():
        weight.mul_(3)  # queued after the copy on the same stream
    (result,) = backend.materialize([Request("w", snap, raw=True, shape=False, reductions=(("l2", False),))])
    np.testing.assert_array_equal(result.raw, expected)
    np.testing.assert_allclose(result.reductions[("l2", False)], np.linalg.norm(expected.ravel()), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_batches_reduced_as_segments_match_the_stacked_path(monkeypatch, dtype):
    """A small batch (a step's biases, a small model) is reduced as segments of one flat
    float64 copy: the reference's values (smdebug.reductions) and those of stacking its
    tensors by shape, for every reduction it takes, including NaN, infinities and a tensor
    whose variance cancels in one pass."""
    keys = tuple((op, is_abs) for op in ("min", "max", "sum", "mean", "variance", "std", "l1", "l2")
                 for is_abs in (False, True) if not (op in ("l1", "l2") and is_abs))
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randn(64, 64, generator=gen, dtype=dtype), torch.randn(64, generator=gen, dtype=dtype),
               torch.full((10,), 1e4, dtype=dtype) + torch.arange(10, dtype=dtype) * 1e-3,
               torch.tensor([1.0, float("nan"), 2.0], dtype=dtype), torch.tensor([float("inf"), 1.0], dtype=dtype),
               torch.tensor([-5.0], dtype=dtype), torch.randn(3, 5, 7, generator=gen, dtype=dtype)]
    batch = torch_backend._CpuBatch(tensors, [t._version for t in tensors], keys, False)
    calls = []
    real = host_reductions.reduce_segments
    monkeypatch.setattr(host_reductions, "reduce_segments", lambda *a: calls.append(1) or real(*a))
    segments = torch_backend._finish_cpu_batch(batch, torch_backend.BufferPool())
    assert calls == [1] and not segments.lost and segments.shapes == [tuple(t.shape) for t in tensors]
    expected = [[float(reductions.reduce(t.numpy(), op, is_abs)) for op, is_abs in keys] for t in tensors]
    np.testing.assert_allclose(segments.reductions, expected, rtol=1e-9, atol=1e-12, equal_nan=True)
    # The stacked path (tensors of one shape as the rows of one array) gives the same.
    monkeypatch.setattr(host_reductions, "segment_plan", lambda *a: None)
    stacked = torch_backend._finish_cpu_batch(batch, torch_backend.BufferPool())
    np.testing.assert_allclose(segments.reductions, stacked.reductions, rtol=1e-12, atol=0, equal_nan=True)
    # The one-pass variance would have cancelled for the 1e4 tensor: it took two passes.
    assert segments.reductions[2, keys.index(("variance", False))] == pytest.approx(np.var(tensors[2].numpy().astype(np.float64)), rel=1e-9)


def test_one_value_tensors_are_reduced_in_python_as_the_reference(monkeypatch):
    """A step's losses and metrics (a few one-element tensors) are reduced from their
    ``.item()`` in plain Python: the reference's value for every reduction and abs form,
    for negative, zero, NaN, infinite and half-precision values; anything else, or more than
    a few, takes the numpy path."""
    keys = tuple((op, is_abs) for op in ("min", "max", "sum", "mean", "variance", "std", "l1", "l2", "prod", "median")
                 + reductions.HEALTH_REDUCTIONS for is_abs in (False, True) if not (op in ("l1", "l2") and is_abs))
    tensors = [torch.tensor(-2.5), torch.tensor([0.0]), torch.tensor(float("nan")), torch.tensor(float("-inf")),
               torch.tensor([[3.25]], dtype=torch.bfloat16), torch.tensor(1e300, dtype=torch.float64),
               torch.tensor(0.1, dtype=torch.float16), torch.tensor(1e-30)]
    assert host_reductions.segment_plan(tuple(t.dtype for t in tensors), tuple(tuple(t.shape) for t in tensors)) \
        is host_reductions.ONE_VALUE_EACH
    monkeypatch.setattr(host_reductions, "reduce_segments", lambda *a: pytest.fail("numpy path taken"))
    batch = torch_backend._CpuBatch(tensors, [t._version for t in tensors], keys, False)
    result = torch_backend._finish_cpu_batch(batch, torch_backend.BufferPool())
    assert not result.lost and result.shapes == [tuple(t.shape) for t in tensors]
    with np.errstate(all="ignore"):
        expected = [[float(reductions.reduce(t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(), op, is_abs))
                     for op, is_abs in keys] for t in tensors]
    np.testing.assert_array_equal(result.reductions, expected)
    for shapes, dtypes in ((((),) * 9, (torch.float32,) * 9), (((), (2,)), (torch.float32,) * 2),
                           (((),), (torch.int64,))):
        assert host_reductions.segment_plan(dtypes, shapes) is not host_reductions.ONE_VALUE_EACH


def test_batches_the_segments_cannot_take_go_the_stacked_way():
    assert host_reductions.segment_plan((torch.float32, torch.float64), ((4, 4), (4,))) is None  # dtypes
    assert host_reductions.segment_plan((torch.float16,) * 2, ((4, 4), (4,))) is None  # half: widened by rows
    assert host_reductions.segment_plan((torch.float32,) * 2, ((4, 4), (0,))) is None  # empty
    assert host_reductions.segment_plan((torch.float32,), ((300, 300),)) is None  # too large
    tensors = [torch.randn(4, 4), torch.randn(4, dtype=torch.float64)]
    keys = (("min", False), ("median", False), ("prod", True))
    batch = torch_backend._CpuBatch(tensors, [t._version for t in tensors], keys, False)
    result = torch_backend._finish_cpu_batch(batch, torch_backend.BufferPool())
    for row, tensor in zip(result.reductions, tensors):
        values = tensor.numpy().astype(np.float64).ravel()
        np.testing.assert_allclose(row, [values.min(), np.median(values), np.abs(values).prod()], rtol=1e-12)


def test_median_and_prod_as_segments():
    keys = (("median", False), ("median", True), ("prod", False))
    tensors = [torch.tensor([3.0, -1.0, 2.0]), torch.tensor([-4.0, 5.0]), torch.tensor([7.0])]
    batch = torch_backend._CpuBatch(tensors, [t._version for t in tensors], keys, False)
    result = torch_backend._finish_cpu_batch(batch, torch_backend.BufferPool())
    np.testing.assert_array_equal(result.reductions, [[2.0, 2.0, -6.0], [0.5, 4.5, -20.0], [7.0, 7.0, 7.0]])


HEALTH_KEYS = tuple(itertools.product(reductions.HEALTH_REDUCTIONS, (False, True)))


def health_tensors():
    limits = []
    for t in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        info = ml_dtypes.finfo(t)
        largest, tiny = np.float32(info.max), np.float32(info.smallest_subnormal)
        limits += [largest, np.nextafter(largest, np.float32(np.inf)), -tiny / 2, np.nextafter(tiny / 2, 1)]
    edge = torch.tensor(limits + [0.0, -0.0, float("nan"), float("inf"), 2.0, -1.0], dtype=torch.float32)
    big = torch.randn(10000, generator=torch.Generator().manual_seed(2)) ** 3
    big[::7] = 0
    big[3] = float("-inf")
    finite = torch.randn(300, 300, generator=torch.Generator().manual_seed(3)) ** 3  # float32 moments
    offset = 50 + torch.randn(300, 300, generator=torch.Generator().manual_seed(4))  # float64 moments
    return sample_tensors() + [edge, edge.double(), big, edge.to(torch.float8_e4m3fn), big.to(torch.float8_e5m2),
                               finite, offset]


@pytest.mark.parametrize("shape, count", [((300, 200), 20), ((1100, 1000), 2)],
                         ids=["a stack of short rows", "rows of several blocks"])
def test_groups_past_one_float64_copy_are_summed_in_blocks_as_numpy(shape, count, segment_ops):
    """Groups of more than WHOLE_WIDE_COPY_MAX elements take their float64 sums block by block
    (the CPU's rows; the segment ops sum float32 tensors in float32: checked to 2e-6 above)."""
    if segment_ops != "rows":
        pytest.skip("the rows path's blocks")
    generator = torch.Generator().manual_seed(6)
    tensors = [torch.randn(shape, generator=generator) * 3 + 0.5 for _ in range(count)]
    group = count * tensors[0].numel() if tensors[0].numel() <= torch_backend.STACK_MAX_NUMEL else tensors[0].numel()
    assert group > host_reductions.WHOLE_WIDE_COPY_MAX
    keys = tuple((op, False) for op in ("sum", "mean", "variance", "std", "l2", "min", "max", "kurtosis", "nonfinite"))
    backend, requests = requests_for(tensors, keys=keys)
    for tensor, result in zip(tensors, backend.materialize(requests)):
        for key, want in zip(keys, reductions.reduce_many(tensor.numpy(), keys)):
            np.testing.assert_allclose(result.reductions[key], want, rtol=1e-12 if key[0] != "kurtosis" else 1e-5,
                                       err_msg=str(key))


@pytest.mark.parametrize("shape", [(64, 4096), (3, 100), (20, 13), (9, 8)])
def test_counts_per_row_of_many_or_few_rows(shape, segment_ops):
    mask = np.random.default_rng(7).random(shape) < 0.3
    assert row_health.count_per_row(mask).tolist() == [float(np.count_nonzero(row)) for row in mask]


def test_kurtosis_of_float32_rows_at_any_scale_equals_numpy():
    """Rows of one group (stacked) whose scales differ by 21 decades: their 4th powers in float32
    would underflow (1e-12 ** 4) or overflow (1e9 ** 4) without the per-row scaling."""
    base = torch.randn(300, 300, generator=torch.Generator().manual_seed(5)) ** 3
    tensors = [base * scale for scale in (1e-12, 1e-6, 1.0, 1e9)] + [base * 1e-12 + 3e-12]
    keys = tuple((op, False) for op in ("min", "max", "mean", "std", "kurtosis", "zero_fraction", "underflow_fp16"))
    backend, requests = requests_for(tensors, keys=keys)
    for tensor, result in zip(tensors, backend.materialize(requests)):
        for key, want in zip(keys, reductions.reduce_many(tensor.numpy(), keys)):
            np.testing.assert_allclose(result.reductions[key], want, rtol=1e-5, err_msg=f"{key} of {tensor.abs().max()}")


@pytest.mark.parametrize("in_place", [False, True])
def test_health_reductions_of_every_dtype_and_path_equal_numpy(monkeypatch, in_place):
    if in_place:
        monkeypatch.setitem(torch_backend.BATCH_MAX_NUMEL, "cpu", 0)  # device path: every tensor alone
    tensors = health_tensors()
    backend, requests = requests_for(tensors, keys=HEALTH_KEYS)
    for tensor, result in zip(tensors, backend.materialize(requests)):
        array = as_numpy(tensor.float() if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else tensor)
        for key, want in zip(HEALTH_KEYS, reductions.reduce_many(array, HEALTH_KEYS)):
            np.testing.assert_allclose(result.reductions[key], want, rtol=1e-5, equal_nan=True,
                                       err_msg=f"{key} of {tensor.dtype} {tuple(tensor.shape)}")


@cuda
def test_cuda_health_reductions_equal_numpy():
    tensors = [t for t in health_tensors() if t.dtype != torch.complex64] + [torch.randn(5_000_000)]
    backend, requests = requests_for([t.cuda() for t in tensors], keys=HEALTH_KEYS)
    for tensor, result in zip(tensors, backend.materialize(requests)):
        array = as_numpy(tensor.float() if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else tensor)
        for key, want in zip(HEALTH_KEYS, reductions.reduce_many(array, HEALTH_KEYS)):
            np.testing.assert_allclose(result.reductions[key], want, rtol=1e-5, equal_nan=True,
                                       err_msg=f"{key} of {tensor.dtype} {tuple(tensor.shape)}")

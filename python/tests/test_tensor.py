"""accrue.Tensor against numpy: operators, views, indexing, conversions, errors."""

import numpy as np
import pytest

import accrue


def rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_import_prints_nothing():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import accrue"], capture_output=True, text=True, check=True
    )
    assert out.stdout == "" and out.stderr == ""


def test_binary_operators_match_numpy(rng):
    a_np, b_np = rand(rng, 3, 4), rand(rng, 3, 4) + 3.0
    a, b = accrue.tensor(a_np, dtype=accrue.f64), accrue.tensor(b_np, dtype=accrue.f64)
    cases = {
        "a+b": (a + b, a_np + b_np),
        "a-b": (a - b, a_np - b_np),
        "a*b": (a * b, a_np * b_np),
        "a/b": (a / b, a_np / b_np),
        "-a": (-a, -a_np),
        "a+2": (a + 2.5, a_np + 2.5),
        "2+a": (2.5 + a, 2.5 + a_np),
        "a-2": (a - 2.5, a_np - 2.5),
        "2-a": (2.5 - a, 2.5 - a_np),
        "a*2": (a * -1.5, a_np * -1.5),
        "2*a": (-1.5 * a, -1.5 * a_np),
        "a/2": (a / 4.0, a_np / 4.0),
        "2/b": (4.0 / b, 4.0 / b_np),
        "b**2": (b**2.0, b_np**2.0),
        "a@b.T": (a @ b.T, a_np @ b_np.T),
    }
    for name, (got, want) in cases.items():
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-14, atol=1e-14, err_msg=name)


def test_broadcasting_and_reductions_match_numpy(rng):
    a_np, row_np = rand(rng, 2, 3, 4), rand(rng, 4)
    a, row = accrue.tensor(a_np, dtype=accrue.f64), accrue.tensor(row_np, dtype=accrue.f64)
    np.testing.assert_allclose((a * row).numpy(), a_np * row_np, rtol=1e-14)
    np.testing.assert_allclose(a.sum().item(), a_np.sum(), rtol=1e-13)
    np.testing.assert_allclose(a.sum(1).numpy(), a_np.sum(1), rtol=1e-13)
    np.testing.assert_allclose(a.mean((0, 2), keepdim=True).numpy(), a_np.mean((0, 2), keepdims=True), rtol=1e-13)
    np.testing.assert_allclose(a.max(-1).numpy(), a_np.max(-1))
    e = np.exp(a_np - a_np.max(-1, keepdims=True))
    np.testing.assert_allclose(a.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-13)


def test_float32_arithmetic(rng):
    a_np = rand(rng, 5).astype(np.float32)
    a = accrue.from_numpy(a_np)
    assert a.dtype == accrue.f32
    np.testing.assert_allclose((a * a + 1.0).numpy(), a_np * a_np + 1.0, rtol=1e-6)


def test_properties():
    t = accrue.zeros((2, 3), dtype=accrue.f64)
    assert t.shape == (2, 3) and isinstance(t.shape, tuple)
    assert t.dtype == accrue.float64 and t.ndim == 2 and len(t) == 2 and t.numel() == 6
    assert str(t.device) == "cpu" and t.device == accrue.Device("cpu")
    assert t.stride() == (3, 1) and t.is_contiguous()
    assert accrue.full([2], 7.0).tolist() == [7.0, 7.0]
    assert accrue.ones([1]).item() == 1.0
    assert accrue.arange(5).dtype == accrue.i64 and accrue.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert accrue.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert accrue.tensor([[1, 2], [3, 4]]).dtype == accrue.i64
    assert accrue.tensor([1.5]).dtype == accrue.f32
    assert accrue.tensor([True, False]).dtype == accrue.bool_
    assert accrue.randn([4, 5]).shape == (4, 5)
    g1, g2 = accrue.Generator(7), accrue.Generator(7)
    assert accrue.randn([3], generator=g1).tolist() == accrue.randn([3], generator=g2).tolist()


def test_to_dtype_and_device():
    t = accrue.tensor([1.25, -2.5], dtype=accrue.f64)
    f = t.to(accrue.f32)
    assert f.dtype == accrue.f32 and f.tolist() == [1.25, -2.5]
    assert t.to(accrue.bf16).to(accrue.f32).tolist() == [1.25, -2.5]
    assert t.to("cpu").tolist() == [1.25, -2.5]
    assert accrue.tensor([3, 4]).to(accrue.f64).tolist() == [3.0, 4.0]


@pytest.mark.parametrize(
    "key",
    [
        1,
        -1,
        (1, 2),
        slice(1, 3),
        slice(None, None, 2),
        (slice(None), slice(1, None, 2)),
        (Ellipsis, 0),
        (None, 1),
        (slice(None), None, 2),
        (0, Ellipsis, slice(0, 4, 3)),
        slice(5, 10),
    ],
)
def test_getitem_matches_numpy_and_shares_memory(rng, key):
    a_np = rand(rng, 3, 4, 5)
    a = accrue.tensor(a_np, dtype=accrue.f64)
    v = a[key]
    np.testing.assert_array_equal(v.numpy(), a_np[key])
    if v.numel() > 0:
        # A view: writing through it shows in the base.
        v.fill_(99.0)
        expected = a_np.copy()
        expected[key] = 99.0
        np.testing.assert_array_equal(a.numpy(), expected)


def test_setitem(rng):
    a = accrue.zeros([3, 4], dtype=accrue.f64)
    a[1] = 5.0
    a[:, ::3] = accrue.tensor([[1.0, 2.0]] * 3, dtype=accrue.f64)
    want = np.zeros((3, 4))
    want[1] = 5.0
    want[:, ::3] = [[1.0, 2.0]] * 3
    np.testing.assert_array_equal(a.numpy(), want)


def test_index_errors_are_python_errors():
    a = accrue.zeros([3, 4])
    with pytest.raises(IndexError, match="out of range"):
        a[3]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 0, 0]
    with pytest.raises(ValueError, match="step"):
        a[::-1]
    assert [row.shape for row in a] == [(4,), (4,), (4,)]


def test_numpy_shares_memory_and_refuses_what_it_cannot():
    t = accrue.zeros([2, 3], dtype=accrue.f64)
    a = t.numpy()
    a[1, 2] = 4.0
    assert t[1, 2].item() == 4.0
    # A transposed view stays a view (strides kept).
    at = t.T.numpy()
    assert at.shape == (3, 2) and at[2, 1] == 4.0 and np.shares_memory(at, a)
    w = accrue.zeros([2], requires_grad=True)
    with pytest.raises(accrue.Error, match="detach"):
        w.numpy()
    assert w.detach().numpy().tolist() == [0.0, 0.0]
    with pytest.raises(accrue.Error, match="bfloat16"):
        accrue.zeros([2], dtype=accrue.bf16).numpy()


def test_bad_input_raises_accrue_error_with_its_message():
    a, b = accrue.zeros([2, 3]), accrue.zeros([5])
    with pytest.raises(accrue.Error) as info:
        a + b
    assert str(info.value) == "add: shapes [2, 3] and [5] cannot be broadcast together"
    assert "tensor.cpp" in info.value.where
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(accrue.Error, match="dtypes f32 and f64"):
        a * accrue.zeros([2, 3], dtype=accrue.f64)
    with pytest.raises(accrue.Error, match="device 'gpu'"):
        accrue.zeros([1], device="gpu")
    with pytest.raises(accrue.OutOfMemoryError) as oom:
        accrue.empty([1 << 40], dtype=accrue.f64)  # 8 TiB
    assert oom.value.requested_bytes > 0 and isinstance(oom.value, MemoryError)


def test_comparisons_are_elementwise(rng):
    a_np, b_np = rng.standard_normal(8), rng.standard_normal(8)
    a, b = accrue.tensor(a_np, dtype=accrue.f64), accrue.tensor(b_np, dtype=accrue.f64)
    for got, want in [(a < b, a_np < b_np), (a >= 0.0, a_np >= 0.0), (a == a, np.ones(8, bool)),
                      (a != b, a_np != b_np), (a > b, a_np > b_np), (a <= 0.5, a_np <= 0.5)]:
        assert got.dtype == accrue.bool_
        np.testing.assert_array_equal(got.numpy(), want)
    relu = accrue.masked_fill(a, a < 0.0, 0.0)
    np.testing.assert_array_equal(relu.numpy(), np.maximum(a_np, 0.0))
    assert len({a, b, a}) == 2  # hashable by identity


def test_assignment_never_writes_into_a_copy():
    w = accrue.zeros([6], requires_grad=True)
    with pytest.raises(accrue.Error):
        w[::2] = 1.0  # a leaf that requires grad: refused, not written into a temporary
    with accrue.no_grad():
        w[::2] = 1.0
    assert w.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_fp8_tensors_are_storage_with_saturating_casts():
    # e4m3fn: exact for its own values, 448 at most (larger values saturate).
    x = accrue.tensor([0.5, -1.75, 448.0, 2.0**-9, 1000.0], dtype=accrue.f32)
    q = x.to(accrue.float8_e4m3fn)
    assert q.dtype == accrue.f8e4m3 and accrue.element_size(q.dtype) == 1
    assert q.to(accrue.f32).tolist() == [0.5, -1.75, 448.0, 2.0**-9, 448.0]
    assert x.to(accrue.f8e5m2).to(accrue.f32).tolist()[:3] == [0.5, -1.75, 448.0]
    assert not accrue.is_floating_point(accrue.f8e4m3)
    # Not a compute dtype: ops refuse it, naming it; numpy has no FP8.
    with pytest.raises(accrue.Error, match="f8e4m3"):
        q + q
    with pytest.raises(accrue.Error, match="f8e4m3"):
        q.numpy()

"""DLPack both ways, zero-copy: numpy everywhere, torch where it is installed."""

import gc

import numpy as np
import pytest

import accrue


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = accrue.from_dlpack(a)
    assert t.shape == (3, 4) and t.dtype == accrue.f64
    a[1, 2] = -7.0
    assert t[1, 2].item() == -7.0
    t[0, 0] = 42.0
    assert a[0, 0] == 42.0
    assert t.data_ptr() == a.ctypes.data


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_])
def test_dtypes_round_trip(dtype):
    a = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    t = accrue.from_dlpack(a)
    back = np.from_dlpack(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    assert np.shares_memory(back, a)


def test_strided_numpy_view_is_imported_without_a_copy():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[1:, ::2]
    t = accrue.from_dlpack(view)
    assert t.shape == (3, 3) and t.stride() == (6, 2)
    np.testing.assert_array_equal(t.numpy(), view)
    t[0, 0] = 100.0
    assert base[1, 0] == 100.0


def test_producer_stays_alive_while_the_tensor_does():
    a = np.full((1000,), 3.0)
    t = accrue.from_dlpack(a)
    del a
    gc.collect()
    assert t.sum().item() == 3000.0


def test_export_to_numpy_shares_memory():
    t = accrue.arange(0.0, 6.0, 1.0, dtype=accrue.f64).reshape(2, 3)
    a = np.from_dlpack(t)
    a[1, 1] = -1.0
    assert t[1, 1].item() == -1.0
    assert t.__dlpack_device__() == (1, 0)
    # The transposed view keeps its strides through the capsule.
    at = np.from_dlpack(t.T)
    assert at.shape == (3, 2) and at.strides == (8, 24)


def test_negative_strides_and_grad_tensors_are_refused():
    with pytest.raises(accrue.Error, match="backwards"):
        accrue.from_dlpack(np.arange(4.0)[::-1])
    w = accrue.zeros([2], requires_grad=True)
    with pytest.raises(accrue.Error, match="requires grad"):
        w.__dlpack__()
    with pytest.raises(TypeError, match="__dlpack__"):
        accrue.from_dlpack([1, 2, 3])


def test_read_only_array_is_copied():
    a = np.arange(3.0)
    a.flags.writeable = False
    t = accrue.from_dlpack(a)
    assert t.tolist() == [0.0, 1.0, 2.0]
    t[0] = 5.0
    assert a[0] == 0.0


def test_torch_round_trip_shares_memory():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = accrue.from_dlpack(x)
    x[2, 3] = -5.0
    assert t[2, 3].item() == -5.0
    t[0, 1] = 9.0
    assert x[0, 1].item() == 9.0
    y = torch.from_dlpack(t)
    y[1, 1] = 77.0
    assert t[1, 1].item() == 77.0
    assert y.data_ptr() == x.data_ptr()


def test_torch_from_accrue_tensor_and_dtypes():
    torch = pytest.importorskip("torch")
    for dt, tdt in [(accrue.f32, torch.float32), (accrue.f64, torch.float64),
                    (accrue.bf16, torch.bfloat16), (accrue.i64, torch.int64)]:
        t = accrue.ones([2, 3], dtype=dt)
        x = torch.from_dlpack(t)
        assert x.dtype == tdt and x.shape == (2, 3)
        x.fill_(2)
        assert t.to(accrue.f64).sum().item() == 12.0
    # A view keeps its offset and strides.
    t = accrue.arange(0.0, 12.0, 1.0, dtype=accrue.f32).reshape(3, 4)[1:, ::2]
    x = torch.from_dlpack(t)
    assert x.tolist() == [[4.0, 6.0], [8.0, 10.0]]


def test_torch_cuda_stream_handshake():
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and accrue.cuda_is_available()):
        pytest.skip("needs CUDA in both torch and accrue")
    t = accrue.ones([1 << 20], device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.from_dlpack(t)  # torch passes s; accrue makes s wait on its stream
        x.mul_(3.0)
    s.synchronize()
    assert t.sum().item() == 3.0 * (1 << 20)
    y = torch.full((1 << 20,), 2.0, device="cuda")
    u = accrue.from_dlpack(y)  # accrue passes its stream; torch makes it wait
    assert u.sum().item() == 2.0 * (1 << 20)


def test_producer_before_dlpack_1_gets_the_legacy_capsule():
    class Legacy:
        """A producer whose __dlpack__ knows no max_version (DLPack < 1.0)."""

        def __init__(self, array):
            self.array = array

        def __dlpack__(self, stream=None):
            return self.array.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    a = np.arange(4.0)
    t = accrue.from_dlpack(Legacy(a))
    t[1] = 10.0
    assert a[1] == 10.0
    # And accrue's own legacy capsule (no max_version asked) is a DLManagedTensor.
    cap = accrue.arange(0.0, 3.0, 1.0, dtype=accrue.f64).__dlpack__()
    assert "dltensor" in repr(cap) and "versioned" not in repr(cap)
    versioned = accrue.zeros([2]).__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(versioned)

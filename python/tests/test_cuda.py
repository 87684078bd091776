"""CUDA tensors from Python (skipped without a GPU)."""

import numpy as np
import pytest

import accrue

pytestmark = pytest.mark.skipif(
    not accrue.cuda_is_available(), reason="no CUDA device (or accrue built without CUDA)"
)


def test_cuda_tensors_compute_and_come_back():
    a_np = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    a = accrue.from_numpy(a_np).to("cuda")
    assert a.device == accrue.Device("cuda:0") and a.__dlpack_device__() == (2, 0)
    b = (a * 2.0 + 1.0).cpu().numpy()
    np.testing.assert_allclose(b, a_np * 2.0 + 1.0, rtol=1e-6)
    with pytest.raises(accrue.Error, match="to\\('cpu'\\)"):
        a.numpy()


def test_window_on_the_gpu_matches_the_cpu():
    from accrue import nn, optim

    def run(device):
        model = nn.MLP([8, 16, 4], device=device, generator=accrue.Generator(0))
        opt = optim.AdamW(1e-2)
        store = optim.ParamStore(
            model.named_parameters(),
            optim.ParamStoreOptions(device=device, moments=opt.moments_needed()),
        )
        window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2))
        gen = accrue.Generator(1)
        for _ in range(4):
            x = accrue.randn([4, 8], generator=gen).to(device)
            y = accrue.randint(0, 4, [4], generator=gen).to(device)
            window.backward(accrue.cross_entropy(model(x), y))
            if window.ready():
                window.close()
        return store.master.cpu().numpy()

    np.testing.assert_allclose(run("cuda"), run("cpu"), rtol=1e-4, atol=1e-5)

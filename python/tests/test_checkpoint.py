"""Checkpoints from a Python loop (safetensors, Window and module state dicts)
resume bitwise; GraphedWindow runs eagerly on the CPU."""

import numpy as np
import pytest

import accrue
from accrue import nn, optim


def build(seed, device="cpu", dtype=accrue.f64):
    gen = accrue.Generator(seed)
    model = nn.Llama(nn.LlamaConfig.from_name("llama-tiny"), device=device, dtype=dtype, generator=gen)
    opt = optim.AdamW(3e-3, weight_decay=0.1)
    store = optim.ParamStore(model.named_parameters(),
                             optim.ParamStoreOptions(master_dtype=dtype,
                                                     moments=opt.moments_needed()))
    window = optim.Window(store, opt, optim.WindowOptions(micro_steps=2, max_grad_norm=0.5))
    return model, opt, store, window


def batch(step, device="cpu"):
    rng = np.random.default_rng(100 + step)
    idx = rng.integers(0, 256, (2, 8))
    targets = rng.integers(0, 256, (2, 8))
    targets[:, -2:] = -100
    return accrue.tensor(idx, device=device), accrue.tensor(targets, device=device)


def params(model):
    return np.concatenate([p.detach().cpu().numpy().ravel().copy() for p in model.parameters()])


def run(model, window, steps):
    for s in steps:
        window.backward(model.loss(*batch(s)))
        if window.ready():
            window.close()


@pytest.mark.parametrize("cut", [4, 5])  # between windows, and mid-window
def test_resume_from_safetensors_equals_uninterrupted(tmp_path, cut):
    model, _, _, window = build(0)
    run(model, window, range(8))
    expected = params(model)

    model, _, _, window = build(0)
    run(model, window, range(cut))
    path = str(tmp_path / "ckpt.safetensors")
    accrue.save_safetensors(path, window.state_dict(), {"step": str(cut)})

    other, _, _, resumed = build(7)  # other initial weights: the checkpoint must overwrite them
    state, meta = accrue.load_safetensors(path, with_metadata=True)
    assert meta == {"step": str(cut)}
    resumed.load_state_dict(state)
    run(other, resumed, range(int(meta["step"]), 8))
    np.testing.assert_array_equal(params(other), expected)
    assert resumed.windows_closed == 4


def test_module_state_dict_round_trips_through_safetensors(tmp_path):
    model, *_ = build(1)
    path = str(tmp_path / "model.safetensors")
    accrue.save_safetensors(path, model.state_dict())
    other, *_ = build(2)
    other.load_state_dict(accrue.load_safetensors(path))
    np.testing.assert_array_equal(params(other), params(model))
    np_path = str(tmp_path / "t.npy")
    t = accrue.randn([3, 4], dtype=accrue.f64)
    accrue.save_npy(np_path, t)
    np.testing.assert_array_equal(np.load(np_path), t.numpy())
    np.testing.assert_array_equal(accrue.load_npy(np_path).numpy(), t.numpy())


@pytest.mark.parametrize("concurrent", [1, 2])
def test_graphed_window_runs_eagerly_on_the_cpu_and_equals_the_window(concurrent):
    model, _, _, window = build(3)
    run(model, window, range(6))
    expected = params(model)

    model, _, _, window = build(3)
    graphed = optim.GraphedWindow(window, lambda idx, targets: model.loss(idx, targets))
    # Note [Concurrent micro-batches]: on the CPU too a group's inputs wait
    # until it is whole (flush() runs one that is not), then run in order.
    graphed.concurrent_micro_batches = concurrent
    graphed.backward(list(batch(0)))
    assert graphed.window.micro_step == (1 if concurrent == 1 else 0)
    graphed.flush()
    assert graphed.window.micro_step == 1
    for s in range(1, 6):
        graphed.backward(list(batch(s)))
        if graphed.ready():
            graphed.close()
    np.testing.assert_array_equal(params(model), expected)
    c = graphed.counts
    assert (c.eager_micro_steps, c.replayed_micro_steps, c.eager_closes, c.graphs) == (6, 0, 3, 0)
    assert graphed.window.windows_closed == 3
    assert np.isfinite(graphed.window.report().loss)


def test_concurrent_micro_batches_refuse_bad_use():
    model, _, _, window = build(3)
    graphed = optim.GraphedWindow(window, lambda idx, targets: model.loss(idx, targets))
    with pytest.raises(accrue.Error, match="n must be >= 1, got 0"):
        graphed.concurrent_micro_batches = 0
    graphed.concurrent_micro_batches = 2
    assert graphed.concurrent_micro_batches == 2
    graphed.backward(list(batch(0)))
    with pytest.raises(accrue.Error, match="before the first backward"):
        graphed.concurrent_micro_batches = 3


def test_weight_grad_branch_is_unused_on_the_cpu_and_refuses_bad_use():
    # Note [Weight gradients on a branch]: graphs only, so on the CPU the same bits as the Window.
    model, _, _, window = build(3)
    run(model, window, range(4))
    expected = params(model)
    model, _, _, window = build(3)
    graphed = optim.GraphedWindow(window, lambda idx, targets: model.loss(idx, targets))
    assert graphed.weight_grad_branch == 0
    with pytest.raises(accrue.Error, match="lag must be >= 0"):
        graphed.weight_grad_branch = -1
    graphed.weight_grad_branch = 2
    with pytest.raises(accrue.Error, match="not with the weight-gradient branch"):
        graphed.concurrent_micro_batches = 2
    for s in range(4):
        graphed.backward(list(batch(s)))
        if graphed.ready():
            graphed.close()
    np.testing.assert_array_equal(params(model), expected)
    assert graphed.counts.graphs == 0
    with pytest.raises(accrue.Error, match="before the first backward"):
        graphed.weight_grad_branch = 1


@pytest.mark.skipif(not accrue.cuda_is_available(), reason="no CUDA device (or accrue built without CUDA)")
@pytest.mark.parametrize("concurrent", [1, 2])
def test_graphed_window_captures_on_the_gpu_and_equals_the_eager_window(concurrent):
    def train(graphed):
        model, _, _, window = build(4, device="cuda", dtype=accrue.f32)
        g = optim.GraphedWindow(window, lambda idx, targets: model.loss(idx, targets)) if graphed else None
        if g:
            g.concurrent_micro_batches = concurrent
        for s in range(8):
            inputs = batch(s, device="cuda")
            if g:
                g.backward(list(inputs))
                if g.ready():
                    g.close()
            else:
                window.backward(model.loss(*inputs))
                if window.ready():
                    window.close()
        return params(model), g

    eager, _ = train(False)
    replayed, g = train(True)
    assert g.why_eager == "", g.why_eager
    assert g.counts.graphs >= 2 and g.counts.replayed_micro_steps > 0, g.counts
    np.testing.assert_array_equal(replayed, eager)


def test_graphed_window_step_errors_reach_python():
    model, _, _, window = build(5)

    def step(idx, targets):
        raise ValueError("bad batch")

    graphed = optim.GraphedWindow(window, step)
    with pytest.raises(ValueError, match="bad batch"):
        graphed.backward(list(batch(0)))
    wrong = optim.GraphedWindow(window, lambda idx, targets: idx)  # not a Loss
    with pytest.raises((TypeError, RuntimeError)):
        wrong.backward(list(batch(0)))
    assert window.micro_step == 0

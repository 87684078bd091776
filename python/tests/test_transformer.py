"""The transformer ops against numpy formulas on random inputs, and their gradients."""

import math

import numpy as np
import pytest

import accrue


def rand(rng, *shape):
    return accrue.from_numpy(rng.standard_normal(shape))


def rms_ref(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def test_rms_norm_and_qk_norm_match_numpy():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 5, 8)), rng.standard_normal(8)
    out = accrue.rms_norm(accrue.from_numpy(x), accrue.from_numpy(w), 1e-5).numpy()
    np.testing.assert_allclose(out, rms_ref(x, w, 1e-5), rtol=1e-12, atol=1e-12)
    q = rng.standard_normal((2, 3, 4, 8))  # [B, T, H, D]
    out = accrue.qk_norm(accrue.from_numpy(q), accrue.from_numpy(w)).numpy()
    np.testing.assert_allclose(out, rms_ref(q, w, 1e-6), rtol=1e-12, atol=1e-12)
    plain = accrue.rms_norm(accrue.from_numpy(x)).numpy()
    np.testing.assert_allclose(plain, rms_ref(x, 1.0, 1e-6), rtol=1e-12, atol=1e-12)


def test_add_rms_norm_and_residual_layer_norm_return_sum_and_normed():
    rng = np.random.default_rng(1)
    x, r, w, b = (rng.standard_normal(s) for s in ((4, 6), (4, 6), (6,), (6,)))
    s, n = accrue.add_rms_norm(*(accrue.from_numpy(a) for a in (x, r, w)))
    np.testing.assert_allclose(s.numpy(), x + r, rtol=0, atol=1e-15)
    np.testing.assert_allclose(n.numpy(), rms_ref(x + r, w, 1e-6), rtol=1e-12, atol=1e-12)
    s, n = accrue.residual_layer_norm(*(accrue.from_numpy(a) for a in (x, r, w, b)))
    y = x + r
    ref = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(s.numpy(), y, rtol=0, atol=1e-15)
    np.testing.assert_allclose(n.numpy(), ref, rtol=1e-10, atol=1e-10)


def llama3_inv_freq(inv, factor, low, high, original):
    """transformers' _compute_llama3_parameters."""
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return np.where(medium, smoothed, scaled)


def rope_ref(x, pos, theta, scaling=None):
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)  # [D/2]
    if scaling:
        inv = llama3_inv_freq(inv, *scaling)
    ang = pos[..., None] * inv  # [B, T, D/2]
    cos, sin = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def test_rope_rotate_half_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 3, 8))
    pos = rng.integers(0, 50, (2, 5)).astype(np.int64)
    out = accrue.rope(accrue.from_numpy(x), accrue.from_numpy(pos), 500.0).numpy()
    np.testing.assert_allclose(out, rope_ref(x, pos.astype(np.float64), 500.0), rtol=1e-10, atol=1e-10)
    # The interleaved style pairs (2i, 2i+1): a permutation of the channels.
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
    inter = accrue.rope(accrue.from_numpy(np.ascontiguousarray(x[..., np.argsort(perm)])),
                        accrue.from_numpy(pos), 500.0, accrue.RopeStyle.Interleaved).numpy()
    np.testing.assert_allclose(inter[..., perm], out, rtol=1e-10, atol=1e-10)


def test_rope_llama3_scaling_keeps_high_frequencies_and_changes_low_ones():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 2, 16))
    pos = accrue.from_numpy(np.arange(4, dtype=np.int64) * 1000)
    sc = accrue.RopeScaling.llama3(8.0, 1.0, 4.0, 64)
    assert sc.type == accrue.RopeScaling.Type.llama3 and sc.original_max_position == 64
    plain = accrue.rope(accrue.from_numpy(x), pos).numpy()
    scaled = accrue.rope(accrue.from_numpy(x), pos, scaling=sc).numpy()
    ref = rope_ref(x, np.arange(4.0)[None] * 1000, 10000.0, (8.0, 1.0, 4.0, 64))
    np.testing.assert_allclose(scaled, ref, rtol=1e-9, atol=1e-9)
    # Channel pair 0 (the highest frequency, wavelength 2*pi < 64/4) is kept.
    np.testing.assert_allclose(scaled[..., [0, 8]], plain[..., [0, 8]], rtol=1e-12, atol=1e-12)
    assert np.abs(scaled[..., [7, 15]] - plain[..., [7, 15]]).max() > 1e-3


def silu(x):
    return x / (1 + np.exp(-x))


def test_swiglu_and_packed_match_numpy():
    rng = np.random.default_rng(4)
    g, u = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    out = accrue.swiglu(accrue.from_numpy(g), accrue.from_numpy(u)).numpy()
    np.testing.assert_allclose(out, silu(g) * u, rtol=1e-12, atol=1e-12)
    packed = accrue.swiglu_packed(accrue.from_numpy(np.concatenate([g, u], -1))).numpy()
    np.testing.assert_allclose(packed, silu(g) * u, rtol=1e-12, atol=1e-12)


def test_linear_gelu_and_classifier_cross_entropy():
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((4, 6)), rng.standard_normal((5, 6)), rng.standard_normal(5)
    z = x @ w.T + b
    ref = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    out = accrue.linear_gelu(*(accrue.from_numpy(a) for a in (x, w, b))).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)
    w2, b2 = rng.standard_normal((3, 5)), rng.standard_normal(3)
    mlp = accrue.linear_gelu_linear(*(accrue.from_numpy(a) for a in (x, w, b, w2, b2))).numpy()
    np.testing.assert_allclose(mlp, ref @ w2.T + b2, rtol=1e-10, atol=1e-10)
    t = np.array([0, 2, -100, 3], dtype=np.int64)
    loss = accrue.classifier_cross_entropy(accrue.from_numpy(x), accrue.from_numpy(w),
                                           accrue.from_numpy(t), 4)
    logits = (x @ w.T)[:, :4]
    lse = np.log(np.exp(logits).sum(-1))
    keep = t != -100
    ref = (lse[keep] - logits[keep, t[keep]]).sum()
    assert loss.count.item() == 3
    assert abs(loss.sum.item() - ref) < 1e-10


def sdpa_ref(q, k, v, lengths=None, causal=False):
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    rep = hq // hkv
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    keep = np.ones(s.shape, bool)
    if causal:
        keep &= np.tril(np.ones((tq, k.shape[2]), bool))
    out = np.zeros((b, hq, tq, v.shape[-1]))
    for i in range(b):
        nq, nk = (tq, k.shape[2]) if lengths is None else (lengths[i], lengths[i])
        kk = keep[i].copy()
        kk[:, :, nk:] = False
        si = np.where(kk, s[i], -np.inf)[:, :nq]
        p = np.exp(si - si.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[i, :, :nq] = p @ v[i]
    return out


def test_attention_gqa_causal_and_lengths_match_numpy_softmax():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 5, 8))
    lengths = np.array([5, 3], dtype=np.int64)
    opts = accrue.SdpaOptions().causal().seq_lens(accrue.from_numpy(lengths))
    out = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a) for a in (q, k, v)), opts)
    np.testing.assert_allclose(out.numpy(), sdpa_ref(q, k, v, lengths, causal=True), rtol=1e-10, atol=1e-12)
    plain = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a) for a in (q, k, v)))
    np.testing.assert_allclose(plain.numpy(), sdpa_ref(q, k, v), rtol=1e-10, atol=1e-12)
    causal = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(causal.numpy(), sdpa_ref(q, k, v, causal=True), rtol=1e-10, atol=1e-12)


def test_attention_options_bias_mask_window_varlen_scale():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    Q, K, V = (accrue.from_numpy(a) for a in (q, k, v))
    keep = np.tril(np.ones((6, 6), bool))[None, None]
    masked = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().mask(accrue.from_numpy(keep)))
    causal = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().causal())
    np.testing.assert_allclose(masked.numpy(), causal.numpy(), rtol=1e-12, atol=1e-12)
    bias = np.where(keep, 0.0, -np.inf)
    biased = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().bias(accrue.from_numpy(bias)))
    np.testing.assert_allclose(biased.numpy(), causal.numpy(), rtol=1e-12, atol=1e-12)
    # A window of 1 key: each query sees only its own key, so the output is v.
    win = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().causal().window(1))
    np.testing.assert_allclose(win.numpy(), v, rtol=1e-12, atol=1e-12)
    # Two packed documents [0, 2) and [2, 6) equal the two attended apart.
    cu = accrue.from_numpy(np.array([0, 2, 6], dtype=np.int64))
    packed = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().causal().varlen(cu)).numpy()
    first = sdpa_ref(q[:, :, :2], k[:, :, :2], v[:, :, :2], causal=True)
    second = sdpa_ref(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:], causal=True)
    np.testing.assert_allclose(packed, np.concatenate([first, second], 2), rtol=1e-10, atol=1e-12)
    scaled = accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().scale(0.5 / math.sqrt(4)))
    np.testing.assert_allclose(scaled.numpy(), sdpa_ref(q * 0.5, k, v), rtol=1e-10, atol=1e-12)
    assert accrue.SdpaOptions().dropout(0.25).dropout_p == 0.25


def test_attention_bottom_right_causal_and_dropout():
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 7, 4)), rng.standard_normal((1, 2, 7, 4))
    Q, K, V = (accrue.from_numpy(a) for a in (q, k, v))
    out = accrue.scaled_dot_product_attention(
        Q, K, V, accrue.SdpaOptions().causal(accrue.MaskAlignment.bottom_right)).numpy()
    # Query i sees keys 0 .. i + 4: a KV cache's last three queries.
    for i in range(3):
        ref = sdpa_ref(q[:, :, i:i + 1], k[:, :, :i + 5], v[:, :, :i + 5])
        np.testing.assert_allclose(out[:, :, i:i + 1], ref, rtol=1e-10, atol=1e-12)

    def dropped(seed):
        g = accrue.Generator(seed)
        return accrue.scaled_dot_product_attention(Q, K, V, accrue.SdpaOptions().dropout(0.5, g)).numpy()

    plain = accrue.scaled_dot_product_attention(Q, K, V).numpy()
    np.testing.assert_array_equal(dropped(3), dropped(3))  # the generator's stream decides
    assert np.abs(dropped(3) - plain).max() > 1e-3
    assert np.abs(dropped(3) - dropped(4)).max() > 1e-3


def test_packed_causal_attention_and_dropout():
    rng = np.random.default_rng(13)
    b, t, h, d = 2, 5, 2, 4
    qkv = rng.standard_normal((b, t, 3 * h * d))
    out = accrue.packed_causal_attention(accrue.from_numpy(qkv), h).numpy()
    q, k, v = (qkv[..., i * h * d:(i + 1) * h * d].reshape(b, t, h, d).transpose(0, 2, 1, 3) for i in range(3))
    ref = sdpa_ref(q, k, v, causal=True).transpose(0, 2, 1, 3).reshape(b, t, h * d)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    x = accrue.ones([1000], dtype=accrue.f64)
    y = accrue.dropout(x, 0.25, generator=accrue.Generator(1)).numpy()
    assert set(np.unique(y)) <= {0.0, 1 / 0.75} and 0.15 < (y == 0).mean() < 0.35
    np.testing.assert_array_equal(accrue.dropout(x, 0.25, training=False).numpy(), x.numpy())


@pytest.mark.parametrize("dtype", [accrue.bf16, accrue.f16, accrue.f32])
def test_16_bit_and_f32_ops_follow_the_f64_ones(dtype):
    rng = np.random.default_rng(14)
    q, k, v = rng.standard_normal((1, 4, 6, 8)), rng.standard_normal((1, 2, 6, 8)), rng.standard_normal((1, 2, 6, 8))
    opts = accrue.SdpaOptions().causal()
    ref = sdpa_ref(q, k, v, causal=True)
    low = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a).to(dtype) for a in (q, k, v)), opts)
    tol = 1e-5 if dtype == accrue.f32 else 3e-2
    np.testing.assert_allclose(low.to(accrue.f64).numpy(), ref, rtol=tol, atol=tol)
    x, w = rng.standard_normal((4, 32)), rng.standard_normal(32)
    out = accrue.rms_norm(accrue.from_numpy(x).to(dtype), accrue.from_numpy(w).to(dtype))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.to(accrue.f64).numpy(), rms_ref(x, w, 1e-6), rtol=tol, atol=tol)


def test_bad_attention_input_raises_accrue_error():
    q = accrue.randn([1, 3, 4, 8], dtype=accrue.f64)
    k = accrue.randn([1, 2, 4, 8], dtype=accrue.f64)
    with pytest.raises(accrue.Error, match="scaled_dot_product_attention: q has 3 heads"):
        accrue.scaled_dot_product_attention(q, k, k)  # 3 query heads over 2 kv heads
    with pytest.raises(accrue.Error, match="rope: head dim D = 5"):
        accrue.rope(accrue.randn([1, 2, 1, 5], dtype=accrue.f64), accrue.arange(2))


def test_gradients_through_the_ops():
    rng = np.random.default_rng(8)
    x = rand(rng, 2, 3, 2, 4).requires_grad_()
    w = rand(rng, 4).requires_grad_()
    pos = accrue.from_numpy(np.array([0, 3, 7], dtype=np.int64))
    g = accrue.gradcheck(lambda a, b: accrue.rope(accrue.rms_norm(a, b), pos), [x, w])
    assert g.ok
    a, r = rand(rng, 12, 4).requires_grad_(), rand(rng, 12, 4).requires_grad_()

    def residual(a, b, c):
        s, n = accrue.add_rms_norm(a, b, c)
        return n * 2.0 + s  # both outputs carry a gradient

    assert accrue.gradcheck(residual, [a, r, w]).ok
    h, cw = rand(rng, 4, 4).requires_grad_(), rand(rng, 6, 4).requires_grad_()
    t = accrue.from_numpy(np.array([0, 3, -100, 4], dtype=np.int64))
    assert accrue.gradcheck(lambda a, b: accrue.classifier_cross_entropy(a, b, t, 5), [h, cw]).ok
    gate, up = rand(rng, 3, 4).requires_grad_(), rand(rng, 3, 4).requires_grad_()
    assert accrue.gradcheck(accrue.swiglu, [gate, up]).ok
    mlp = [rand(rng, *s).requires_grad_() for s in ((2, 3, 4), (6, 4), (6,), (5, 6), (5,))]
    assert accrue.gradcheck(accrue.linear_gelu_linear, mlp).ok
    q = rand(rng, 1, 2, 3, 4).requires_grad_()
    k = rand(rng, 1, 1, 3, 4).requires_grad_()
    v = rand(rng, 1, 1, 3, 4).requires_grad_()
    opts = accrue.SdpaOptions().causal()
    assert accrue.gradcheck(lambda a, b, c: accrue.scaled_dot_product_attention(a, b, c, opts), [q, k, v]).ok
    # backward leaves gradients on the leaves.
    out = accrue.scaled_dot_product_attention(q, k, v, opts).sum()
    out.backward()
    assert q.grad is not None and np.isfinite(q.grad.numpy()).all()
    assert np.abs(k.grad.numpy()).sum() > 0


def test_matches_torch_where_installed():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 5, 8))
    ours = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a) for a in (q, k, v)), is_causal=True)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq, tk.repeat_interleave(2, 1), tv.repeat_interleave(2, 1), is_causal=True)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not accrue.cuda_is_available(), reason="no CUDA device (or accrue built without CUDA)")
def test_gpu_attention_and_rms_norm_match_the_cpu():
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 16, 32), (2, 2, 16, 32), (2, 2, 16, 32)))
    lengths = accrue.from_numpy(np.array([16, 9], dtype=np.int64))
    opts = accrue.SdpaOptions().causal().seq_lens(lengths)
    cpu = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a) for a in (q, k, v)), opts).numpy()
    gpu_opts = accrue.SdpaOptions().causal().seq_lens(lengths.to("cuda"))
    gpu = accrue.scaled_dot_product_attention(*(accrue.from_numpy(a).to("cuda") for a in (q, k, v)), gpu_opts)
    np.testing.assert_allclose(gpu.cpu().numpy(), cpu, rtol=1e-4, atol=1e-5)
    x, w = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    out = accrue.rms_norm(accrue.from_numpy(x).to("cuda"), accrue.from_numpy(w).to("cuda"))
    np.testing.assert_allclose(out.cpu().numpy(), rms_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)


class Block(accrue.nn.Module):
    """A Llama-style block written in Python from the bound ops (GQA, rope, padded rows)."""

    def __init__(self, gen, vocab=11, d=8, heads=2, kv_heads=1):
        super().__init__()
        nn = accrue.nn
        f64 = accrue.f64
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.embed = nn.Parameter(accrue.randn([vocab, d], dtype=f64, generator=gen) * 0.5)
        self.norm = nn.Parameter(accrue.ones([d], dtype=f64))
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False, dtype=f64, generator=gen)
        self.o = nn.Linear(heads * self.hd, d, bias=False, dtype=f64, generator=gen)
        self.up = nn.Linear(d, 2 * 16, bias=False, dtype=f64, generator=gen)
        self.down = nn.Linear(16, d, bias=False, dtype=f64, generator=gen)
        self.post = nn.Parameter(accrue.ones([d], dtype=f64))
        self.head = nn.Parameter(accrue.randn([vocab, d], dtype=f64, generator=gen) * 0.5)

    def loss(self, idx, targets, lengths):
        b, t = idx.shape
        x = accrue.embedding(self.embed, idx)
        qkv = self.qkv(accrue.rms_norm(x, self.norm)).reshape([b, t, self.heads + 2 * self.kv_heads, self.hd])
        pos = accrue.arange(t)
        q = accrue.rope(qkv[:, :, :self.heads], pos).transpose(1, 2)
        k = accrue.rope(qkv[:, :, self.heads:self.heads + self.kv_heads], pos).transpose(1, 2)
        v = qkv[:, :, self.heads + self.kv_heads:].transpose(1, 2)
        opts = accrue.SdpaOptions().causal().seq_lens(lengths)
        a = accrue.scaled_dot_product_attention(q, k, v, opts).transpose(1, 2).reshape([b, t, -1])
        x, h = accrue.add_rms_norm(self.o(a), x, self.post)
        x = x + self.down(accrue.swiglu_packed(self.up(h)))
        return accrue.classifier_cross_entropy(x, self.head, targets, 11)


def test_python_block_from_the_ops_accumulates_exactly():
    rng = np.random.default_rng(12)
    windows, batch, t = 2, 8, 6
    idx = rng.integers(0, 11, (windows, batch, t))
    targets = rng.integers(0, 11, (windows, batch, t))
    lengths = rng.integers(2, t + 1, (windows, batch))
    for w in range(windows):
        for r in range(batch):
            targets[w, r, lengths[w, r]:] = -100

    class Run:
        def __init__(self, k):
            self.model = Block(accrue.Generator(5))
            opt = accrue.optim.AdamW(1e-2)
            self.store = accrue.optim.ParamStore(
                self.model.named_parameters(),
                accrue.optim.ParamStoreOptions(master_dtype=accrue.f64, moments=opt.moments_needed()))
            self.opt = opt
            self.window = accrue.optim.Window(self.store, opt, accrue.optim.WindowOptions(micro_steps=k))

        def micro_step(self, w, begin, end):
            self.window.backward(self.model.loss(accrue.tensor(idx[w, begin:end]),
                                                 accrue.tensor(targets[w, begin:end]),
                                                 accrue.tensor(lengths[w, begin:end])))

        def close(self):
            self.window.close()

        def parameters(self):
            return self.store.master.numpy()

    report = accrue.optim.verify_accumulation(Run, windows=windows, micro_steps=4, batch=batch)
    assert report.passed, report.table()

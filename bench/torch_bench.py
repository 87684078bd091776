#!/usr/bin/env python3
"""PyTorch counterparts of accrue_bench, timed the same way on the same GPU.

Each benchmark has the name of its accrue_bench twin (bench/bench_*.cpp), so
bench/compare.py can put the two side by side. Timing follows Note [GPU
timing] in bench/bench_util.h: fresh torch.randn inputs, a warm-up, then for
each sample a GPU spin (torch.cuda._sleep) so that the host's launch overhead
is hidden, CUDA events around one call, and the median of the samples.

f32 matrix products run in true fp32 (allow_tf32 off), and bf16 products
accumulate in fp32 without reduced-precision split-K reductions, as accrue's
do.

    python3 bench/torch_bench.py --json torch_bench.json [--filter REGEX]
"""
import argparse
import json
import math
import re
import statistics
import sys

import torch

N = 1 << 28  # elements of the large bandwidth benchmarks (1 GiB of f32)
TOKENS = 8192  # GPT-2 124M, B=8 x T=1024
MATMUL_SHAPES = [  # (layer, M, K, N): a [M, K] @ b [K, N]
    ("qkv", TOKENS, 768, 2304),
    ("proj", TOKENS, 768, 768),
    ("fc", TOKENS, 768, 3072),
    ("fc2", TOKENS, 3072, 768),
    ("logits", TOKENS, 768, 50304),
]
# bench/bench_gpt2_gemm.cpp: every Linear of GPT-2 124M (out, in), at M tokens.
GPT2_LINEARS = [("qkv", 2304, 768), ("proj", 768, 768), ("fc", 3072, 768), ("fc2", 768, 3072),
                ("logits", 50304, 768)]
GPT2_TOKENS = [1024, 8192, 32768]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# About 0.5 ms at Hopper clocks: longer than any op here takes to launch.
SLEEP_CYCLES = 1_000_000


def benchmarks():
    """Yields (name, op, shape, dtype, make_inputs, fn, bytes, flop)."""

    def copy_inputs():
        return torch.randn(N, device="cuda"), torch.empty(N, device="cuda")

    yield ("copy/d2d/1GiB", "copy", [N], "f32", copy_inputs,
           lambda src, dst: dst.copy_(src), 2 * N * 4, 0)
    for name, dtype in DTYPES.items():
        size = torch.tensor([], dtype=dtype).element_size()
        yield (f"add/{name}/n={N}", "add", [N], name,
               lambda dtype=dtype: (torch.randn(N, device="cuda", dtype=dtype),
                                    torch.randn(N, device="cuda", dtype=dtype)),
               torch.add, 3 * N * size, 0)
    # contiguous() of a transformer's strided views (bench/bench_copy.cpp).
    layouts = [
        ("copy_layout/head_split/bf16/8x1024x12x64", [8, 1024, 12, 64], torch.bfloat16,
         lambda x: x.permute(0, 2, 1, 3)),
        ("copy_layout/qkv_split/bf16/8x1024x3x12x64", [8, 1024, 3, 12, 64], torch.bfloat16,
         lambda x: x.permute(2, 0, 3, 1, 4)),
        ("copy_layout/narrow_q/bf16/8x1024x2304", [8, 1024, 2304], torch.bfloat16,
         lambda x: x.narrow(2, 768, 768)),
        ("copy_layout/k_transpose/bf16/8x12x1024x64", [8, 12, 1024, 64], torch.bfloat16,
         lambda x: x.transpose(2, 3)),
        ("copy_layout/head_split/bf16/64x1024x12x64", [64, 1024, 12, 64], torch.bfloat16,
         lambda x: x.permute(0, 2, 1, 3)),
        ("copy_layout/k_transpose/bf16/64x12x1024x64", [64, 12, 1024, 64], torch.bfloat16,
         lambda x: x.transpose(2, 3)),
        ("copy_layout/transpose/f32/8192x8192", [8192, 8192], torch.float32,
         lambda x: x.transpose(0, 1)),
    ]
    for name, shape, dtype, view in layouts:
        size = torch.tensor([], dtype=dtype).element_size()
        numel = view(torch.empty(shape, device="meta")).numel()
        yield (name, "copy_layout", shape, name.split("/")[2],
               lambda shape=shape, dtype=dtype, view=view: (
                   view(torch.randn(shape, device="cuda", dtype=dtype)),),
               lambda x: x.contiguous(), 2 * numel * size, 0)
    for name, dtype in DTYPES.items():
        size = torch.tensor([], dtype=dtype).element_size()
        yield (f"mask_add/{name}/8x12x1024x1024", "mask_add", [8, 12, 1024, 1024], name,
               lambda dtype=dtype: (torch.randn(8, 12, 1024, 1024, device="cuda", dtype=dtype),
                                    torch.randn(1024, 1024, device="cuda", dtype=dtype)),
               torch.add, (2 * 8 * 12 * 1024 * 1024 + 1024 * 1024) * size, 0)
    yield (f"sum_all/f32/n={N}", "sum_all", [N], "f32",
           lambda: (torch.randn(N, device="cuda"),), torch.sum, (N + 1) * 4, 0)
    yield ("sum_rows/f32/16384x16384", "sum_rows", [16384, 16384], "f32",
           lambda: (torch.randn(16384, 16384, device="cuda"),),
           lambda x: x.sum(dim=1), (N + 16384) * 4, 0)
    yield ("sum_cols/f32/262144x1024", "sum_cols", [262144, 1024], "f32",
           lambda: (torch.randn(262144, 1024, device="cuda"),),
           lambda x: x.sum(dim=0), (N + 1024) * 4, 0)
    for name, dtype in DTYPES.items():
        for layer, m, k, n in MATMUL_SHAPES:
            yield (f"matmul/{name}/{layer}_{m}x{k}x{n}", "matmul", [m, k, n], name,
                   lambda m=m, k=k, n=n, dtype=dtype: (
                       torch.randn(m, k, device="cuda", dtype=dtype),
                       torch.randn(k, n, device="cuda", dtype=dtype)),
                   torch.matmul, 0, 2 * m * n * k)

    yield from gpt2_gemms()
    yield from fp8_gemms()
    yield from resnet_convs()
    yield from model_ops()
    yield from attention_variants()
    yield from fused_ops()
    yield from gpt2_norms()


def model_ops():
    """bench/bench_model_ops.cpp's ops: the same names, shapes and bytes."""
    tokens, width, vocab, embed, experts = 16384, 4096, 32000, 2048, 128
    scores = [8, 16, 1024, 1024]
    bf16, f32 = torch.bfloat16, torch.float32

    def randn(shape, dtype):
        return lambda: torch.randn(shape, device="cuda", dtype=dtype)

    def nbytes(shape, dtype):
        return math.prod(shape) * torch.tensor([], dtype=dtype).element_size()

    def idx(high, shape):
        return torch.randint(0, high, shape, device="cuda")

    big = [tokens, width]
    yield ("model_ops/silu/bf16/16384x4096", "silu", big, "bf16",
           lambda: (randn(big, bf16)(),), torch.nn.functional.silu, 2 * nbytes(big, bf16), 0)
    yield ("model_ops/rsqrt/f32/16384x4096", "rsqrt", big, "f32",
           lambda: (randn(big, f32)(),), torch.rsqrt, 2 * nbytes(big, f32), 0)
    yield ("model_ops/clamp/bf16/16384x4096", "clamp", big, "bf16",
           lambda: (randn(big, bf16)(),), lambda x: x.clamp(-1.0, 1.0), 2 * nbytes(big, bf16), 0)
    yield ("model_ops/maximum/bf16/16384x4096", "maximum", big, "bf16",
           lambda: (randn(big, bf16)(), randn(big, bf16)()), torch.maximum,
           3 * nbytes(big, bf16), 0)
    yield ("model_ops/masked_fill/bf16/8x16x1024x1024", "masked_fill", scores, "bf16",
           lambda: (randn(scores, bf16)(), torch.randn(1024, 1024, device="cuda") > 0),
           lambda x, m: x.masked_fill(m, -1e4), 2 * nbytes(scores, bf16) + 1024 * 1024, 0)
    yield ("model_ops/triu/f32/8x16x1024x1024", "triu", scores, "f32",
           lambda: (randn(scores, f32)(),), lambda x: torch.triu(x, 1), 2 * nbytes(scores, f32), 0)
    half = [tokens, width // 2]
    yield ("model_ops/cat/bf16/2x16384x2048", "cat", half, "bf16",
           lambda: (randn(half, bf16)(), randn(half, bf16)()),
           lambda a, b: torch.cat((a, b), 1), 4 * nbytes(half, bf16), 0)
    kv = [8, 8, 2048, 128]
    yield ("model_ops/repeat_interleave/bf16/8x8x2048x128", "repeat_interleave", kv, "bf16",
           lambda: (randn(kv, bf16)(),), lambda k: k.repeat_interleave(4, 1),
           5 * nbytes(kv, bf16), 0)
    yield ("model_ops/index_select/bf16/32000x2048", "index_select", [vocab, embed], "bf16",
           lambda: (randn([vocab, embed], bf16)(), idx(vocab, [tokens])),
           lambda t, i: t.index_select(0, i), 2 * tokens * embed * 2 + tokens * 8, 0)
    yield ("model_ops/index_add/f32/32000x2048", "index_add", [vocab, embed], "f32",
           lambda: (randn([vocab, embed], f32)(), idx(vocab, [tokens]),
                    randn([tokens, embed], f32)()),
           lambda t, i, s: t.index_add(0, i, s),
           2 * nbytes([vocab, embed], f32) + nbytes([tokens, embed], f32) + tokens * 8, 0)
    yield ("model_ops/gather/f32/16384x4096", "gather", big, "f32",
           lambda: (randn(big, f32)(), idx(width, big)), lambda x, i: x.gather(1, i),
           2 * nbytes(big, f32) + tokens * width * 8, 0)
    yield ("model_ops/cumsum/f32/16384x4096", "cumsum", big, "f32",
           lambda: (randn(big, f32)(),), lambda x: x.cumsum(1), 2 * nbytes(big, f32), 0)
    router = [tokens, experts]
    yield ("model_ops/topk/f32/16384x128/k=8", "topk", router, "f32",
           lambda: (randn(router, f32)(),), lambda x: x.topk(8, 1),
           nbytes(router, f32) + tokens * 8 * (4 + 8), 0)
    yield ("model_ops/argsort/f32/16384x128", "argsort", router, "f32",
           lambda: (randn(router, f32)(),), lambda x: x.argsort(1, descending=True),
           nbytes(router, f32) + tokens * experts * 8, 0)


def fused_ops():
    """bench/bench_fused.cpp's ops: the same names, shapes and bytes, each as the
    formula transformers' Llama code writes it, in eager and, with "/compile"
    appended to the name, under torch.compile. rope's cos and sin tables are
    given precomputed (transformers computes them once per forward for every
    layer) and not counted; accrue computes them inside its kernel."""
    tokens, width, heads, head_dim, ffn = 16384, 4096, 32, 128, 11008
    batch, seq = 8, tokens // 8
    bf16 = torch.bfloat16
    f = torch.nn.functional

    def randn(*shape, dtype=bf16, grad=False):
        return torch.randn(shape, device="cuda", dtype=dtype, requires_grad=grad)

    def nbytes(*shape):
        return math.prod(shape) * 2

    def rms_norm(x, w, eps=1e-6):  # LlamaRMSNorm.forward
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    def add_rms_norm(x, r, w):
        s = x + r
        return s, rms_norm(s, w)

    def rope(q, cos, sin):  # apply_rotary_pos_emb on [B, T, H, D], cos/sin [B, T, D]
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        q1, q2 = q[..., : q.shape[-1] // 2], q[..., q.shape[-1] // 2:]
        return q * c + torch.cat((-q2, q1), dim=-1) * s

    def rope_tables():
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device="cuda").float()
                                       / head_dim))
        pos = torch.randint(0, seq, (batch, seq), device="cuda").float()
        freqs = pos[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(bf16), emb.sin().to(bf16)

    def swiglu(x):
        gate, up = x.chunk(2, dim=-1)
        return f.silu(gate) * up

    def backward_of(fn, nargs_grad):
        """fn's backward alone: the forward runs once when the inputs are made."""
        def make(make_inputs):
            def inputs():
                args = make_inputs()
                out = fn(*args)
                return (out, torch.randn_like(out), args[:nargs_grad])
            return inputs
        return make, lambda out, dy, wrt: torch.autograd.grad(out, wrt, dy, retain_graph=True)

    def fp8_amax(x):
        return x.abs().amax()

    def fp8_cast(x, scale):  # saturating, as accrue's and Transformer Engine's casts
        return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

    def fp8_cast_transpose(x, scale):
        q = fp8_cast(x, scale)
        return q, q.t().contiguous()

    big = [tokens, width]
    qshape = [batch, seq, heads, head_dim]
    scale3 = lambda: torch.full((1,), 3.0, device="cuda")  # noqa: E731
    rows = [
        ("fused/rms_norm/bf16/16384x4096", "rms_norm", big,
         lambda: (randn(*big), randn(width)), rms_norm, 2 * nbytes(*big) + 2 * width),
        ("fused/add_rms_norm/bf16/16384x4096", "add_rms_norm", big,
         lambda: (randn(*big), randn(*big), randn(width)), add_rms_norm,
         4 * nbytes(*big) + 2 * width),
        ("fused/qk_norm/bf16/8x2048x32x128", "qk_norm", qshape,
         lambda: (randn(batch, seq, 3, heads, head_dim)[:, :, 0], randn(head_dim)), rms_norm,
         2 * nbytes(*qshape)),
        ("fused/rope/bf16/8x2048x32x128", "rope", qshape,
         lambda: (randn(*qshape), *rope_tables()), rope, 2 * nbytes(*qshape) + batch * seq * 8),
        ("fused/swiglu/bf16/16384x11008", "swiglu", [tokens, 2 * ffn],
         lambda: (randn(tokens, 2 * ffn),), swiglu, 3 * nbytes(tokens, ffn)),
        ("fused/fp8_amax/bf16/16384x4096", "fp8_amax", big, lambda: (randn(*big),), fp8_amax,
         nbytes(*big)),
        ("fused/fp8_cast/bf16/16384x4096", "fp8_cast", big, lambda: (randn(*big), scale3()),
         fp8_cast, 1.5 * nbytes(*big)),
        ("fused/fp8_cast_transpose/bf16/16384x4096", "fp8_cast_transpose", big,
         lambda: (randn(*big), scale3()), fp8_cast_transpose, 2 * nbytes(*big)),
    ]
    make_rms_bwd, run_bwd = backward_of(rms_norm, 2)
    make_swiglu_bwd, _ = backward_of(swiglu, 1)
    backward_rows = [
        ("fused/rms_norm_backward/bf16/16384x4096", "rms_norm_backward", big,
         make_rms_bwd(lambda: (randn(*big, grad=True), randn(width, grad=True))),
         3 * nbytes(*big) + 3 * 2 * width),
        ("fused/rms_norm_backward/bf16/16384x768", "rms_norm_backward", [tokens, 768],
         make_rms_bwd(lambda: (randn(tokens, 768, grad=True), randn(768, grad=True))),
         3 * nbytes(tokens, 768) + 3 * 2 * 768),
        ("fused/swiglu_backward/bf16/16384x11008", "swiglu_backward", [tokens, 2 * ffn],
         make_swiglu_bwd(lambda: (randn(tokens, 2 * ffn, grad=True),)),
         5 * nbytes(tokens, ffn)),
    ]
    for name, op, shape, inputs, fn, nb in rows:
        yield (name, op, shape, "bf16", inputs, fn, nb, 0)
        yield (name + "/compile", op, shape, "bf16", inputs, torch.compile(fn), nb, 0)
    for name, op, shape, inputs, nb in backward_rows:
        yield (name, op, shape, "bf16", inputs, run_bwd, nb, 0)


def fp8_gemms():
    """bench/bench_fp8_gemm.cpp's per-tensor rows (fp8_gemm/.../tensor) through
    torch._scaled_mm, the GEMM PyTorch's FP8 recipes (bench/torch_fp8.py) call: out =
    a @ b^T with a [m, k] (x in e4m3, or dy in e5m2) and b [n, k] in e4m3, each
    with its f32 inverse scale, bf16 out; wgrad's f32 product then added to the
    fp32 slot (_scaled_mm has no beta), where accrue's GEMM adds it in place. The
    block rows have no twin here."""
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def codes(rows, k, dtype):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        top = 448.0 if dtype == e4m3 else 57344.0
        scale = top / x.abs().amax().float()
        return (x.float() * scale).to(dtype), (1.0 / scale).reshape(())

    def gemm(a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    def gemm_into_slot(a, b, sa, sb, slot):
        return slot.add_(torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                          out_dtype=torch.float32))

    for layer, out, inp in GPT2_LINEARS:
        if layer == "logits":  # the classifier stays in bf16
            continue
        for tokens in (8192, 32768):
            flop = 2 * tokens * out * inp
            for name, m, n, k in (("fwd", tokens, out, inp), ("dgrad", tokens, inp, out),
                                  ("wgrad", out, inp, tokens)):
                a_dtype = e4m3 if name == "fwd" else e5m2

                def inputs(m=m, n=n, k=k, a_dtype=a_dtype, wgrad=name == "wgrad"):
                    (a, sa), (b, sb) = codes(m, k, a_dtype), codes(n, k, e4m3)
                    if wgrad:
                        return (a, b, sa, sb, torch.randn(m, n, device="cuda"))
                    return (a, b, sa, sb)

                yield (f"fp8_gemm/{layer}_{out}x{inp}/M={tokens}/{name}/tensor", "fp8_gemm",
                       [m, n, k], "f8", inputs, gemm_into_slot if name == "wgrad" else gemm, 0,
                       flop)


def gpt2_norms():
    """bench/bench_gpt2_norms.cpp's LayerNorms, on the same names, shapes and bytes: the
    block's residual add and F.layer_norm in eager and, with "/compile" appended, under
    torch.compile (static shapes: one graph a shape); F.layer_norm's backward (dx,
    dweight, dbias) in eager."""
    bf16 = torch.bfloat16
    f = torch.nn.functional
    eps = 1e-5

    def randn(*shape, grad=False):
        return torch.randn(shape, device="cuda", dtype=bf16, requires_grad=grad)

    def residual_layer_norm(x, r, w, b):
        s = x + r
        return s, f.layer_norm(s, (s.shape[-1],), w, b, eps)

    compiled = torch.compile(residual_layer_norm, dynamic=False)
    for rows, width in ((1024, 768), (32768, 768), (8192, 1600)):
        elements = rows * width
        fwd_bytes = 8 * elements + 4 * width + 8 * rows
        bwd_bytes = 6 * elements + 8 * rows + 2 * width + 16 * width
        name = f"gpt2_norm/residual_layer_norm/bf16/{rows}x{width}"

        def fwd_inputs(rows=rows, width=width):
            return (randn(rows, width), randn(rows, width), randn(width), randn(width))

        def bwd_inputs(rows=rows, width=width):
            x, w, b = randn(rows, width, grad=True), randn(width, grad=True), randn(width, grad=True)
            y = f.layer_norm(x, (width,), w, b, eps)
            return (y, torch.randn_like(y), (x, w, b))

        yield (name, "residual_layer_norm", [rows, width], "bf16", fwd_inputs,
               residual_layer_norm, fwd_bytes, 0)
        yield (name + "/compile", "residual_layer_norm", [rows, width], "bf16", fwd_inputs,
               compiled, fwd_bytes, 0)
        yield (f"gpt2_norm/layer_norm_backward/bf16/{rows}x{width}", "layer_norm_backward",
               [rows, width], "bf16", bwd_inputs,
               lambda y, dy, wrt: torch.autograd.grad(y, wrt, dy, retain_graph=True), bwd_bytes, 0)


def gpt2_gemms():
    """The GEMMs of a GPT-2 training step (bench/bench_gpt2_gemm.cpp has the same
    names): fwd x @ W^T and dgrad g @ W in bf16; wgrad g^T x added to an fp32
    slot by one addmm with out_dtype=float32 (the same arithmetic as accrue's
    beta-1 GEMM), and, under gpt2_gemm_torch_pattern/, what autograd does under
    autocast: a bf16 product, then added to the fp32 .grad."""
    bf16 = torch.bfloat16

    def randn(*shape, dtype=bf16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    # The classifier's forward chunk (Note [Classifier chunk rows]).
    yield ("gpt2_gemm/logits_50304x768/M=4096/fwd", "gpt2_gemm", [4096, 50304, 768], "bf16",
           lambda: (randn(4096, 768), randn(50304, 768)), lambda x, w: torch.matmul(x, w.t()), 0,
           2 * 4096 * 50304 * 768)
    for layer, out, inp in GPT2_LINEARS:
        for m in GPT2_TOKENS:
            base = f"gpt2_gemm/{layer}_{out}x{inp}/M={m}"
            flop = 2 * m * out * inp
            yield (f"{base}/fwd", "gpt2_gemm", [m, out, inp], "bf16",
                   lambda m=m, out=out, inp=inp: (randn(m, inp), randn(out, inp)),
                   lambda x, w: torch.matmul(x, w.t()), 0, flop)
            yield (f"{base}/dgrad", "gpt2_gemm", [m, out, inp], "bf16",
                   lambda m=m, out=out, inp=inp: (randn(m, out), randn(out, inp)),
                   torch.matmul, 0, flop)
            yield (f"{base}/wgrad", "gpt2_gemm", [m, out, inp], "bf16",
                   lambda m=m, out=out, inp=inp: (randn(out, inp, dtype=torch.float32),
                                                  randn(m, out), randn(m, inp)),
                   lambda slot, g, x: torch.addmm(slot, g.t(), x, out_dtype=torch.float32),
                   0, flop)
            if layer == "logits" and m > 4096:  # the classifier's dgrad, fp32 out
                yield (f"{base}/dgrad_f32", "gpt2_gemm", [m, out, inp], "bf16",
                       lambda m=m, out=out, inp=inp: (randn(m, out), randn(out, inp)),
                       lambda g, w: torch.mm(g, w, out_dtype=torch.float32), 0, flop)
            yield (f"gpt2_gemm_torch_pattern/{layer}_{out}x{inp}/M={m}/wgrad", "gpt2_gemm",
                   [m, out, inp], "bf16",
                   lambda m=m, out=out, inp=inp: (randn(out, inp, dtype=torch.float32),
                                                  randn(m, out), randn(m, inp)),
                   lambda slot, g, x: slot.add_(g.t() @ x), 0, flop)


# bench/bench_conv.cpp: ResNet-50's distinct convolutions (c, o, size, kernel, stride).
RESNET_CONVS = [(3, 64, 224, 7, 2),
                (64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1),
                (256, 128, 56, 1, 1), (128, 128, 56, 3, 2), (128, 512, 28, 1, 1),
                (256, 512, 56, 1, 2), (512, 128, 28, 1, 1), (128, 128, 28, 3, 1),
                (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (256, 1024, 14, 1, 1),
                (512, 1024, 28, 1, 2), (1024, 256, 14, 1, 1), (256, 256, 14, 3, 1),
                (1024, 512, 14, 1, 1), (512, 512, 14, 3, 2), (512, 2048, 7, 1, 1),
                (1024, 2048, 14, 1, 2), (2048, 512, 7, 1, 1), (512, 512, 7, 3, 1)]
RESNET_BATCH = 64


def resnet_convs():
    """ResNet-50's convolutions as a channels-last model under bf16 autocast runs
    them (bench/bench_conv.cpp has the same names): F.conv2d, the data gradient
    and the weight gradient of aten.convolution_backward, the latter in bf16 and
    then added to an fp32 slot (autograd's pattern). wgrad_bf16 and its
    _timed and _nondet variants are the same PyTorch call (cudnn.benchmark
    off, non-deterministic engines admitted: PyTorch's defaults), the twins
    of accrue's 16-bit weight-gradient policies."""
    bf16, last = torch.bfloat16, torch.channels_last

    def randn(*shape, dtype=bf16, fmt=last):
        return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)

    def backward(mask):
        def run(dy, x, w, stride, pad):
            return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2,
                                                       [1, 1], False, [0, 0], 1, mask)
        return run

    data, weight = backward([True, False, False]), backward([False, True, False])
    for c, o, size, k, stride in RESNET_CONVS:
        pad, n = k // 2, RESNET_BATCH
        out = (size + 2 * pad - k) // stride + 1
        base = f"conv/bf16/{c}to{o}_{k}x{k}_s{stride}_{size}/B={n}"
        flop = 2 * n * out * out * o * c * k * k
        shape = [n, c, size, size, o, k, stride]

        def inputs(c=c, o=o, size=size, k=k, out=out):
            return (randn(n, o, out, out), randn(n, c, size, size), randn(o, c, k, k),
                    torch.randn(o, c, k, k, device="cuda").contiguous(memory_format=last))

        # fwd_cudnn / dgrad_cudnn: accrue's 1 x 1 stride-1 calls on cuDNN, not as GEMMs.
        variants = ("", "_cudnn") if k == 1 and stride == 1 else ("",)
        for v in variants:
            yield (f"{base}/fwd{v}", "conv", shape, "bf16", inputs,
                   lambda dy, x, w, slot, s=stride, p=pad: torch.nn.functional.conv2d(
                       x, w, None, s, p), 0, flop)
            yield (f"{base}/dgrad{v}", "conv", shape, "bf16", inputs,
                   lambda dy, x, w, slot, s=stride, p=pad: data(dy, x, w, s, p)[0], 0, flop)
        for name in ("wgrad", "wgrad_bf16", "wgrad_bf16_timed", "wgrad_bf16_nondet"):
            yield (f"{base}/{name}", "conv", shape, "bf16", inputs,
                   lambda dy, x, w, slot, s=stride, p=pad: slot.add_(weight(dy, x, w, s, p)[1]),
                   0, flop)



def attention_variants():
    """bench/bench_attention.cpp's rows: F.scaled_dot_product_attention(enable_gqa=True)."""
    F = torch.nn.functional
    B, HQ, HKV, T, D = 4, 32, 8, 2048, 128
    # packed_causal: the B * T tokens as one row of these documents (bench_attention.cpp's
    # kDocuments), attention never crossing one: a block-diagonal causal boolean mask.
    documents = [1500, 700, 2048, 300, 1200, 900, 1544]
    variants = [("causal", True, False, 0, False, False),
                ("padded_causal", True, True, 0, False, False),
                ("window512_causal", True, False, 512, False, False),
                ("bias", False, False, 0, True, False),
                ("packed_causal", True, False, 0, False, True)]
    for name, causal, padded, window, bias, packed in variants:
        for backward in (False, True):
            def make(causal=causal, padded=padded, window=window, bias=bias, packed=packed,
                     backward=backward):
                def rand(*shape):
                    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=backward)
                rows, n = (1, B * T) if packed else (B, T)
                q, k, v = rand(rows, HQ, n, D), rand(rows, HKV, n, D), rand(rows, HKV, n, D)
                i = torch.arange(n, device="cuda")
                mask = None
                if padded or window or packed:  # a boolean mask: what PyTorch users pass for these
                    keep = (i[None, :] <= i[:, None])[None, None]
                    if window:
                        keep = keep & (i[:, None] - i[None, :] < window)[None, None]
                    if padded:
                        lens = torch.randint(T // 2, T + 1, (B,), device="cuda")
                        keep = keep & (i[None, None, None, :] < lens[:, None, None, None])
                    if packed:
                        doc = torch.repeat_interleave(
                            torch.arange(len(documents), device="cuda"),
                            torch.tensor(documents, device="cuda"))
                        keep = keep & (doc[:, None] == doc[None, :])[None, None]
                    mask = keep
                elif bias:
                    mask = rand(1, HQ, T, T)
                grad = torch.randn(rows, HQ, n, D, device="cuda", dtype=torch.bfloat16)
                return q, k, v, mask, grad

            def fn(q, k, v, mask, grad, causal=causal, backward=backward):
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal and mask is None, enable_gqa=True)
                if backward:
                    out.backward(grad)
                return out

            # Packed documents count each document's own products (bench_attention.cpp's rule).
            squares = sum(L * L for L in documents) if packed else B * T * T
            flop = 4.0 * HQ * squares * D * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)
            yield (f"attention/gqa_{name}/bf16/4x32x8x2048x128/{'fwd_bwd' if backward else 'fwd'}",
                   "attention", [B, HQ, HKV, T, D], "bf16", make, fn, 0, flop)

def time_ms(fn, inputs, warmup, repeats):
    """Median GPU milliseconds of one call of fn(*inputs)."""
    for _ in range(warmup):
        fn(*inputs)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn(*inputs)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples), min(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--filter", default="", help="regex on benchmark names")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("torch_bench: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    gpu = torch.cuda.get_device_name()
    results = []
    copy_bytes_per_s = None
    print(f"torch_bench: {gpu}, torch {torch.__version__}")
    print(f"{'benchmark':<40} {'ms':>9} {'rate':>16} {'copy frac':>9}")
    for name, op, shape, dtype, make_inputs, fn, nbytes, flop in benchmarks():
        if args.filter and not re.search(args.filter, name):
            continue
        try:
            inputs = make_inputs()
            ms, ms_min = time_ms(fn, inputs, args.warmup, args.repeats)
        except Exception as e:  # noqa: BLE001 - one twin's failure must not lose the others
            # compare.py shows the error in the PyTorch column, as accrue_bench's skipped rows.
            message = f"{type(e).__name__}: {e}".splitlines()[0]
            print(f"{name:<40} skipped: {message}", flush=True)
            results.append({"name": name, "op": op, "shape": shape, "dtype": dtype,
                            "error": message})
            inputs = None
            torch.cuda.empty_cache()
            continue
        del inputs
        torch.cuda.empty_cache()
        row = {"name": name, "op": op, "shape": shape, "dtype": dtype, "ms": ms,
               "ms_min": ms_min, "repeats": args.repeats}
        if nbytes:
            bytes_per_s = nbytes / (ms * 1e-3)
            if op == "copy":
                copy_bytes_per_s = bytes_per_s
            row.update({"bytes": nbytes, "GB/s": bytes_per_s * 1e-9})
            if copy_bytes_per_s:
                row["copy_frac"] = bytes_per_s / copy_bytes_per_s
            rate = f"{row['GB/s']:.0f} GB/s"
        else:
            row.update({"flop": flop, "TFLOP/s": flop / (ms * 1e-3) * 1e-12})
            rate = f"{row['TFLOP/s']:.1f} TFLOP/s"
        frac = f"{row['copy_frac']:.2f}" if "copy_frac" in row else ""
        print(f"{name:<40} {ms:>9.3f} {rate:>16} {frac:>9}", flush=True)
        results.append(row)

    report = {
        "context": {
            "gpu": gpu,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "copy_bandwidth_GBps": copy_bytes_per_s * 1e-9 if copy_bytes_per_s else None,
            "statistic": f"median of {args.repeats} after {args.warmup} warm-up calls",
        },
        "benchmarks": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 linear layers for the PyTorch benchmarks, the twin of accrue's fp8_linear.

    from torch_fp8 import convert_to_fp8
    convert_to_fp8(model, lambda name, layer: name.endswith(("c_attn", "c_fc")))

Fp8Linear is nn.Linear computed with torch._scaled_mm, as accrue's
fp8_linear (Note [FP8 linear] in autograd/fp8_ops.h) computes it:

  forward   y  = x W^T (+ bias): x and W cast to e4m3 with per-tensor current
            scaling (scale = 448 / amax), out in bf16;
  backward  dy cast to e5m2 (scale = 57344 / amax);
            dx = dy W    (e5m2 x e4m3, out bf16);
            dW = dy^T x  (e5m2 x e4m3, out fp32, the parameters' dtype).

torch._scaled_mm takes its first operand row-major and its second
column-major, so the backward uses the transposed codes (W^T, dy^T, x^T),
made by .t().contiguous() of the codes. The weight is cast again at every
micro-batch (accrue casts it once per window: Note [Window FP8 weights]); an
infinity or NaN in x or dy makes the outputs NaN (as Note [FP8 overflow]),
so a GradScaler or a NaN check sees it. Rows, in and out features must be
multiples of 16. Works on the CPU too (torch's CPU _scaled_mm), for checks.
"""
import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}


def cast(x, dtype):
    """(codes, scale_inv): x * scale rounded to `dtype`, scale = max / amax (1 for an all-zero
    x); scale_inv is NaN when amax is not finite, so the GEMMs' outputs are NaN."""
    amax = x.detach().abs().amax().float()
    finite = torch.isfinite(amax)
    scale = torch.where((amax > 0) & finite, MAX[dtype] / amax, torch.ones_like(amax))
    codes = (x.float() * scale).clamp(-MAX[dtype], MAX[dtype]).to(dtype)
    scale_inv = torch.where(finite, 1.0 / scale, torch.full_like(scale, float("nan")))
    return codes, scale_inv


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias):
        x8, sx = cast(x2, E4M3)
        w8, sw = cast(weight, E4M3)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        if bias is not None:
            y = y + bias.to(torch.bfloat16)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = cast(dy, E5M2)
        dx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=sg, scale_b=sw,
                              out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=sg,
                              scale_b=sx, out_dtype=torch.float32)
        db = dy.float().sum(0) if ctx.has_bias else None
        return dx, dw, db


class Fp8Linear(torch.nn.Module):
    """An nn.Linear whose GEMMs run in FP8 (bf16 output); takes over the layer's parameters."""

    def __init__(self, linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x):
        shape = x.shape
        y = _Fp8LinearFn.apply(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight,
                               self.bias)
        return y.reshape(*shape[:-1], y.shape[-1])


def convert_to_fp8(model, wanted):
    """Replaces every nn.Linear of `model` for which wanted(name, layer) holds by an
    Fp8Linear with the same parameters; returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, torch.nn.Linear) and wanted(full, child):
                setattr(module, child_name, Fp8Linear(child))
                replaced.append(full)
    return replaced

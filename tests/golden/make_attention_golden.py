#!/usr/bin/env python3
"""Generates the golden fixture of accrue's attention variants from PyTorch's
F.scaled_dot_product_attention (tests/golden/README.md):

    python3 tests/golden/make_attention_golden.py --out tests/golden/fixtures

Needs torch only (2.5 or newer, for enable_gqa; the math backend, which is
differentiable in a float attn_mask); the safetensors file is
written by the small writer below. Everything is float64 on the CPU, one
fixed seed. Writes attention.safetensors; for every case "<case>":

  <case>.q, .k, .v        q [B, Hq, T, d], k and v [B, Hkv, S, d]
  <case>.grad_out         a random output gradient
  <case>.out              F.scaled_dot_product_attention(q, k, v, attn_mask,
                          is_causal, enable_gqa=True)
  <case>.dq, .dk, .dv     torch.autograd.grad(out, (q, k, v), grad_out)
  <case>.bias, .dbias     a float attn_mask that requires grad, and its gradient
  <case>.mask             a boolean attn_mask (True: attend)
  <case>.seq_len_q, .seq_len_kv, .cu_seqlens
                          i64 lengths (right-padded batch) or document
                          offsets (packed documents), for accrue's options

and the __metadata__ "<case>.causal" (none, top_left, bottom_right) and
"<case>.window" (0: none). The masks accrue builds from its options are built
here explicitly as boolean attn_masks, the way a PyTorch user writes them:

  gqa, mqa            enable_gqa=True (8 query heads on 2 kv heads; 3 on 1)
  causal_top_left     is_causal=True with T < S (PyTorch's alignment)
  causal_bottom_right torch.ones(T, S).tril(diagonal=S - T)
  padded              per-sequence lengths: key j < L[b], causal; the padded
                      query rows get an all-True mask row (so that PyTorch's
                      math path gives no NaN) and their output is multiplied
                      by 0, so out and dq are 0 there, as accrue defines
  varlen              three documents (one empty) packed into T: block-diagonal
                      and causal within each document, B = 1
  window              causal with a sliding window of 3: diag - 3 < j <= diag
  bias, bias_batch    an additive float mask [1, Hq, T, S] / [B, 1, T, S]
  mask                a random boolean mask [B, 1, T, S], key 0 always visible
"""

import argparse
import json
import os
import struct

SEED = 20261127


def save_safetensors(tensors, path, metadata):
    """The safetensors format with torch alone: an 8-byte little-endian header
    length, the JSON header (padded with spaces to 8 bytes), the data."""
    import torch
    names = {torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for key in sorted(tensors):
        t = tensors[key].detach().contiguous().cpu()
        raw = t.to(torch.uint8) if t.dtype == torch.bool else t
        data = bytes(raw.reshape(-1).view(torch.uint8).tolist())
        header[key] = {"dtype": names[t.dtype], "shape": list(t.shape),
                       "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write attention.safetensors into")
    args = p.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(SEED)
    t = {}
    meta = {"generator": "python3 tests/golden/make_attention_golden.py",
            "torch": torch.__version__}
    f64 = torch.float64

    def rand(*shape):
        return torch.randn(*shape, dtype=f64)

    def record(case, B, Hq, Hkv, T, S, d, causal="none", window=0, attn_mask=None,
               is_causal=False, bias_shape=None, row_valid=None, extra=None):
        q, k, v = rand(B, Hq, T, d), rand(B, Hkv, S, d), rand(B, Hkv, S, d)
        grad_out = rand(B, Hq, T, d)
        leaves = [x.requires_grad_() for x in (q, k, v)]
        bias = None
        if bias_shape is not None:
            bias = rand(*bias_shape).requires_grad_()
            leaves.append(bias)
            attn_mask = bias
        # The math backend: the reference formula, differentiable in the float mask.
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                 is_causal=is_causal, enable_gqa=True)
        if row_valid is not None:  # [B, T] of 0/1: padded query rows give 0
            out = out * row_valid[:, None, :, None]
        grads = torch.autograd.grad(out, leaves, grad_out)
        for name, x in (("q", q), ("k", k), ("v", v), ("grad_out", grad_out), ("out", out),
                        ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])):
            t[f"{case}.{name}"] = x.detach()
        if bias is not None:
            t[f"{case}.bias"] = bias.detach()
            t[f"{case}.dbias"] = grads[3]
        elif attn_mask is not None and attn_mask.dtype == torch.bool and case == "mask":
            t[f"{case}.mask"] = attn_mask
        for name, x in (extra or {}).items():
            t[f"{case}.{name}"] = x
        meta[f"{case}.causal"] = causal
        meta[f"{case}.window"] = str(window)

    record("gqa", 2, 8, 2, 6, 6, 4, causal="top_left", is_causal=True)
    record("mqa", 2, 3, 1, 5, 7, 4)
    record("causal_top_left", 2, 4, 2, 4, 7, 4, causal="top_left", is_causal=True)
    T, S = 4, 7
    br = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    record("causal_bottom_right", 2, 4, 2, T, S, 4, causal="bottom_right", attn_mask=br)

    # Right-padded batch, causal, lengths 6, 4 and 1 of T = 6.
    lens, T = [6, 4, 1], 6
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = torch.zeros(len(lens), 1, T, T, dtype=torch.bool)
    valid = torch.zeros(len(lens), T, dtype=f64)
    for b, L in enumerate(lens):
        mask[b, 0] = (j < L) & (j <= i)
        mask[b, 0, L:] = True  # padded rows: anything finite, zeroed below
        valid[b, :L] = 1.0
    lens_t = torch.tensor(lens, dtype=torch.int64)
    record("padded", 3, 4, 2, T, T, 4, causal="top_left", attn_mask=mask, row_valid=valid,
           extra={"seq_len_q": lens_t, "seq_len_kv": lens_t})

    # Packed documents of 3, 0, 4 and 2 tokens, causal within each.
    cu, T = [0, 3, 3, 7, 9], 9
    doc = torch.empty(T, dtype=torch.int64)
    for n in range(len(cu) - 1):
        doc[cu[n]:cu[n + 1]] = n
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = ((doc[:, None] == doc[None, :]) & (j <= i))[None, None]
    record("varlen", 1, 4, 2, T, T, 4, causal="top_left", attn_mask=mask,
           extra={"cu_seqlens": torch.tensor(cu, dtype=torch.int64)})

    # Causal sliding window of 3 (Hugging Face's sliding_window, cuDNN's length).
    T, w = 8, 3
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = ((j <= i) & (j > i - w))[None, None]
    record("window", 2, 4, 2, T, T, 4, causal="top_left", window=w, attn_mask=mask)

    record("bias", 2, 4, 2, 5, 6, 4, bias_shape=(1, 4, 5, 6))
    record("bias_batch", 2, 4, 2, 5, 6, 4, bias_shape=(2, 1, 5, 6))

    mask = torch.rand(2, 1, 5, 6) > 0.4
    mask[..., 0] = True  # no row fully masked (PyTorch's math path would give NaN)
    record("mask", 2, 4, 2, 5, 6, 4, attn_mask=mask)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "attention.safetensors")
    save_safetensors(t, path, meta)
    print(f"wrote {path}: {len(t)} tensors")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Generates the golden fixtures of accrue's convolution, pooling and
normalization ops from PyTorch (tests/golden/README.md):

    python3 tests/golden/make_conv_golden.py --out tests/golden/fixtures

Writes conv.safetensors (float64, CPU, one fixed seed). For every case
"<case>": the inputs, a random output gradient "<case>.grad", PyTorch's
output "<case>.out" and the gradients of its inputs "<case>.d<input>"
(torch.autograd.grad of <out, grad>). The options of each case are in the
__metadata__, "<case>.<option>" -> value.

Cases:
  conv_*          torch.nn.functional.conv2d with stride, padding, dilation, groups, bias
  maxpool, avgpool, avgpool_nopad, adaptive
                  max_pool2d, avg_pool2d (count_include_pad true and false),
                  adaptive_avg_pool2d
  groupnorm       torch.nn.functional.group_norm with affine parameters
  bn_*            torch.nn.BatchNorm2d's running statistics: after K forwards of
                  micro-batches ("bn_per_micro_batch.running_*"), and after one
                  forward of their concatenation ("bn_whole.running_*"); the
                  micro-batches are "bn.x<k>"
"""

import argparse
import sys

SEED = 20261126
CONV_CASES = [
    dict(name="conv_plain", x=(2, 3, 7, 6), w=(4, 3, 3, 3), stride=(1, 1), padding=(0, 0),
         dilation=(1, 1), groups=1),
    dict(name="conv_strided", x=(2, 4, 9, 8), w=(6, 4, 3, 2), stride=(2, 1), padding=(1, 2),
         dilation=(1, 1), groups=1),
    dict(name="conv_dilated", x=(1, 2, 9, 9), w=(3, 2, 3, 3), stride=(1, 2), padding=(2, 1),
         dilation=(2, 2), groups=1),
    dict(name="conv_grouped", x=(2, 6, 6, 6), w=(9, 2, 3, 3), stride=(1, 1), padding=(1, 1),
         dilation=(1, 1), groups=3),
]
POOL = dict(kernel=(3, 2), stride=(2, 1), padding=(1, 1))
BN_K, BN_MICRO = 4, (2, 3, 4, 4)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write conv.safetensors into")
    args = p.parse_args()
    import torch
    import torch.nn.functional as F
    try:
        from safetensors.torch import save_file
    except ImportError:
        sys.exit("make_conv_golden.py needs the safetensors package (pip install safetensors)")
    torch.manual_seed(SEED)
    t, meta = {}, {"generator": "python3 tests/golden/make_conv_golden.py",
                   "torch": torch.__version__}

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    def record(case, fn, inputs):
        leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
        out = fn(**leaves)
        grad = rand(*out.shape)
        grads = torch.autograd.grad(out, list(leaves.values()), grad)
        for k, v in inputs.items():
            t[f"{case}.{k}"] = v
        t[f"{case}.out"] = out.detach()
        t[f"{case}.grad"] = grad
        for k, g in zip(leaves, grads):
            t[f"{case}.d{k}"] = g

    for c in CONV_CASES:
        for k in ("stride", "padding", "dilation"):
            meta[f"{c['name']}.{k}"] = f"{c[k][0]},{c[k][1]}"
        meta[f"{c['name']}.groups"] = str(c["groups"])
        record(c["name"],
               lambda x, w, b, c=c: F.conv2d(x, w, b, c["stride"], c["padding"], c["dilation"],
                                             c["groups"]),
               {"x": rand(*c["x"]), "w": rand(*c["w"]), "b": rand(c["w"][0])})
    for k in ("kernel", "stride", "padding"):
        meta[f"pool.{k}"] = f"{POOL[k][0]},{POOL[k][1]}"
    x = rand(2, 3, 9, 7)
    record("maxpool", lambda x: F.max_pool2d(x, POOL["kernel"], POOL["stride"], POOL["padding"]),
           {"x": x})
    record("avgpool", lambda x: F.avg_pool2d(x, POOL["kernel"], POOL["stride"], POOL["padding"]),
           {"x": x})
    record("avgpool_nopad",
           lambda x: F.avg_pool2d(x, POOL["kernel"], POOL["stride"], POOL["padding"],
                                  count_include_pad=False), {"x": x})
    record("adaptive", lambda x: F.adaptive_avg_pool2d(x, (4, 3)), {"x": x})
    meta["groupnorm.groups"] = "2"
    record("groupnorm", lambda x, w, b: F.group_norm(x, 2, w, b, 1e-5),
           {"x": rand(3, 4, 5, 3), "w": rand(4), "b": rand(4)})

    micro = [rand(*BN_MICRO) * (0.5 + k) + 0.3 * k for k in range(BN_K)]
    per = torch.nn.BatchNorm2d(BN_MICRO[1], momentum=0.1).double().train()
    for m in micro:
        per(m)
    whole = torch.nn.BatchNorm2d(BN_MICRO[1], momentum=0.1).double().train()
    whole(torch.cat(micro))
    for k, m in enumerate(micro):
        t[f"bn.x{k}"] = m
    t["bn_per_micro_batch.running_mean"] = per.running_mean.detach().clone()
    t["bn_per_micro_batch.running_var"] = per.running_var.detach().clone()
    t["bn_whole.running_mean"] = whole.running_mean.detach().clone()
    t["bn_whole.running_var"] = whole.running_var.detach().clone()
    meta["bn.micro_batches"] = str(BN_K)
    meta["bn.momentum"] = "0.1"

    import os
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "conv.safetensors")
    save_file({k: v.detach().clone().contiguous() for k, v in t.items()}, path, metadata=meta)
    print(f"wrote {len(t)} tensors to {path}")


if __name__ == "__main__":
    main()

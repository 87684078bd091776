#!/usr/bin/env python3
"""Generates the golden fixture of accrue's unused-parameter policy (Note
[Unused parameters] in optim/window.h) from PyTorch:

    python3 tests/golden/make_unused_golden.py --out tests/golden/fixtures

Writes unused_parameters.safetensors (float64, CPU, one fixed seed). A small
model trains for W windows of K micro-batches with AdamW (weight decay and
amsgrad, foreach=False: the single-tensor reference math):

    h   = tanh(trunk(x))
    out = head(h)
        + branch.out(tanh(branch(h)))    in the micro-batches where branch_on[w, k]
        + expert.out(tanh(expert(x)))    in the micro-batches where expert_on[w, k]
    loss of a micro-batch = sum((out - y)^2) / N,  N = K * B items per window

Each window is `for k: loss_k.backward()`, then `opt.step()` and
`opt.zero_grad(set_to_none=...)`, twice:
  "skip": set_to_none=True (PyTorch's default): a parameter without a
          gradient in a window is skipped (no decay, no moment change, its own
          step count unchanged). accrue's UnusedParameters::skip.
  "zero": set_to_none=False: once a parameter has had a gradient, an unused
          one steps with a zero gradient. accrue's UnusedParameters::step_with_zero.
          Every parameter is used in window 0, so the two agree from the start.
The branch is used in some windows (and then in one micro-batch only); the
expert in window 0, in none of windows 1..11, then again.

Tensors: "init.<name>"; "x" [W, K, B, D], "y" [W, K, B, O]; "branch_on",
"expert_on" i64 [W, K]; for each run r in (skip, zero): "<r>.params.<name>"
[W, ...] (after each window), "<r>.grad_norm" [W] (the L2 norm of the
window's gradient over the parameters that have one), the final
"<r>.exp_avg.<name>", "<r>.exp_avg_sq.<name>", "<r>.max_exp_avg_sq.<name>",
and "<r>.step.<name>" (0-d, torch's per-parameter step count). Metadata:
the names in order ("names"), W, K, B and every hyperparameter.
"""

import argparse
import sys

SEED = 20260513
W, K, B = 20, 3, 4
D, H, O = 5, 6, 3
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.99), 1e-8, 0.1
NAMES = ["trunk.w", "trunk.b", "head.w", "head.b", "branch.w", "branch.b", "branch.out.w",
         "branch.out.b", "expert.w", "expert.b", "expert.out.w", "expert.out.b"]
SHAPES = {"trunk.w": (H, D), "trunk.b": (H,), "head.w": (O, H), "head.b": (O,),
          "branch.w": (H, H), "branch.b": (H,), "branch.out.w": (O, H), "branch.out.b": (O,),
          "expert.w": (H, D), "expert.b": (H,), "expert.out.w": (O, H), "expert.out.b": (O,)}


def schedules(torch):
    branch = torch.zeros(W, K, dtype=torch.int64)
    expert = torch.zeros(W, K, dtype=torch.int64)
    for w in range(W):
        if w % 3 != 1:
            branch[w, w % K] = 1  # one micro-batch of the window
        if w == 0 or w >= 12:
            expert[w, 1] = 1
    return branch, expert


def forward(torch, p, x, branch_on, expert_on):
    F = torch.nn.functional
    h = torch.tanh(F.linear(x, p["trunk.w"], p["trunk.b"]))
    out = F.linear(h, p["head.w"], p["head.b"])
    if branch_on:
        out = out + F.linear(torch.tanh(F.linear(h, p["branch.w"], p["branch.b"])),
                             p["branch.out.w"], p["branch.out.b"])
    if expert_on:
        out = out + F.linear(torch.tanh(F.linear(x, p["expert.w"], p["expert.b"])),
                             p["expert.out.w"], p["expert.out.b"])
    return out


def train(torch, init, x, y, branch, expert, set_to_none, run, t):
    p = {n: init[n].clone().requires_grad_(True) for n in NAMES}
    opt = torch.optim.AdamW([p[n] for n in NAMES], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                            amsgrad=True, foreach=False)
    n_items = K * B
    history = {n: [] for n in NAMES}
    norms = []
    for w in range(W):
        for k in range(K):
            out = forward(torch, p, x[w, k], bool(branch[w, k]), bool(expert[w, k]))
            d = out - y[w, k]
            ((d * d).sum() / n_items).backward()
        grads = [p[n].grad for n in NAMES if p[n].grad is not None]
        norms.append(torch.sqrt(sum((g * g).sum() for g in grads)))
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        for n in NAMES:
            history[n].append(p[n].detach().clone())
    for n in NAMES:
        t[f"{run}.params.{n}"] = torch.stack(history[n])
        st = opt.state[p[n]]
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            t[f"{run}.{key}.{n}"] = st[key].detach().clone()
        t[f"{run}.step.{n}"] = torch.tensor(float(st["step"]), dtype=torch.float64)
    t[f"{run}.grad_norm"] = torch.stack(norms)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory to write unused_parameters.safetensors")
    args = ap.parse_args()
    import torch
    try:
        from safetensors.torch import save_file
    except ImportError:
        sys.exit("make_unused_golden.py needs the safetensors package (pip install safetensors)")
    torch.manual_seed(SEED)
    t = {}
    init = {n: 0.5 * torch.randn(*SHAPES[n], dtype=torch.float64) for n in NAMES}
    for n in NAMES:
        t[f"init.{n}"] = init[n]
    x = torch.randn(W, K, B, D, dtype=torch.float64)
    y = torch.randn(W, K, B, O, dtype=torch.float64)
    branch, expert = schedules(torch)
    t.update({"x": x, "y": y, "branch_on": branch, "expert_on": expert})
    train(torch, init, x, y, branch, expert, True, "skip", t)
    train(torch, init, x, y, branch, expert, False, "zero", t)
    meta = {"generator": "python3 tests/golden/make_unused_golden.py", "torch": torch.__version__,
            "seed": str(SEED), "names": ",".join(NAMES), "windows": str(W),
            "micro_steps": str(K), "batch": str(B), "lr": repr(LR), "beta1": repr(BETAS[0]),
            "beta2": repr(BETAS[1]), "eps": repr(EPS), "weight_decay": repr(WD),
            "amsgrad": "true"}
    save_file({k: v.contiguous() for k, v in t.items()}, f"{args.out}/unused_parameters.safetensors",
              metadata=meta)


if __name__ == "__main__":
    main()

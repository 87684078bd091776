#!/usr/bin/env python3
"""PyTorch counterparts of bench_window_close.cpp and bench_wgrad.cpp, same names, same GPU.

Window close: PyTorch's idiomatic recipe on separate parameter tensors, as
users hold them (GPT-2 124M: 148 tensors; the sweep: one flat tensor):

    found_inf.zero_(); inv_scale = scale.double().reciprocal().float()   # GradScaler.unscale_
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    opt.step()               # AdamW(fused=True); opt.found_inf = found_inf, as GradScaler.step sets
    torch._amp_update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000)  # GradScaler.update
    torch._foreach_zero_(grads)                                          # zero_grad(set_to_none=False)

About 52 bytes per parameter (unscale 8, norm 4, clip 8, AdamW 28, zero 4)
against accrue's 32; the floor reported beside both is accrue's bytes at the
copy bandwidth. The timed calls see fresh random gradients: they are copied
back from a random source before each one, outside the timing.

Weight-gradient accumulation, dW [out, in] from bf16 g [T, out] and x [T, in]
into an fp32 accumulator acc:
    write             torch.mm(g.t(), x, out_dtype=torch.float32, out=acc)
    write_bf16        torch.mm(g.t(), x)            (the bf16 gradient autograd makes)
    accumulate        acc += g.t() @ x              (AccumulateGrad: bf16 GEMM, then an add)
    unfused_f32_tmp   acc += torch.mm(g.t(), x, out_dtype=torch.float32)
    unfused_bf16_tmp  acc += (g.t() @ x).float()    (autocast's cast, then AccumulateGrad)
    accumulate_addmm  torch.addmm(acc, g.t(), x, out_dtype=torch.float32, out=acc)
The out_dtype forms need a PyTorch that has them (2.8 or so); each variant is
checked on a small case first and reported as an error row when it is
missing or wrong.

Timing follows Note [GPU timing] in bench/bench_util.h: a warm-up, then per
sample a GPU sleep longer than the host takes to enqueue the call (measured),
CUDA events around one call, the median of the samples.

    python3 bench/torch_accumulation.py --json torch_accumulation.json [--filter REGEX]
"""
import argparse
import json
import re
import statistics
import sys
import time

import torch

# ---- the settings bench_window_close.cpp uses ----------------------------------------
LR, BETAS, EPS, WEIGHT_DECAY = 6e-4, (0.9, 0.95), 1e-8, 0.1
INIT_SCALE, GROWTH, BACKOFF, GROWTH_INTERVAL = 65536.0, 2.0, 0.5, 2000
MAX_NORM = 1.0
SWEEP = [1_000_000, 10_000_000, 50_000_000, 124_475_904, 500_000_000]
# Bytes per parameter: PyTorch's recipe, and accrue's (the floor's bytes).
CLOSE_CASES = {  # name: (torch bytes, accrue bytes)
    "close": (52, 32),
    "close_bf16copy": (58, 34),  # + a bf16 copy of the new parameters: read 4, write 2
    "norm": (4, 4),
    "adamw": (28, 28),
    "adamw_bf16copy": (34, 30),
}

# ---- the shapes bench_wgrad.cpp uses ------------------------------------------------
WGRAD_SHAPES = [("qkv", 2304, 768), ("fc", 3072, 768), ("fc2", 768, 3072)]  # dW [out, in]
TOKENS = [8192, 16384, 32768]

MIN_SLEEP_MS, MAX_SLEEP_MS = 0.1, 20.0


def gpt2_124m_shapes():
    """GPT-2 124M in nanoGPT's order, vocabulary padded to 50304: 124,475,904 parameters."""
    vocab, context, width, layers = 50304, 1024, 768, 12
    shapes = [(vocab, width), (context, width)]
    for _ in range(layers):
        shapes += [(width,), (width,),                    # ln_1
                   (3 * width, width), (3 * width,),      # attn.c_attn
                   (width, width), (width,),              # attn.c_proj
                   (width,), (width,),                    # ln_2
                   (4 * width, width), (4 * width,),      # mlp.c_fc
                   (width, 4 * width), (width,)]          # mlp.c_proj
    return shapes + [(width,), (width,)]                  # ln_f


# ---- timing -------------------------------------------------------------------------

class Timer:
    """CUDA-event timing of one call behind a GPU sleep (Note [GPU timing])."""

    def __init__(self, warmup, repeats):
        self.warmup, self.repeats = warmup, repeats
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(5):
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        self.cycles_per_ms = 1_000_000 / statistics.median(samples)

    def time_ms(self, fn, prepare=None):
        """Median and minimum GPU milliseconds of fn(); prepare() runs untimed before each call."""
        prepare = prepare or (lambda: None)
        for _ in range(self.warmup):
            prepare()
            fn()
        torch.cuda.synchronize()
        enqueue_s = 0.0
        for _ in range(3):
            prepare()
            torch.cuda.synchronize()
            begin = time.perf_counter()
            fn()
            enqueue_s = max(enqueue_s, time.perf_counter() - begin)
            torch.cuda.synchronize()
        sleep_ms = min(max(2e3 * enqueue_s, MIN_SLEEP_MS), MAX_SLEEP_MS)
        cycles = int(sleep_ms * self.cycles_per_ms)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(self.repeats):
            prepare()
            torch.cuda._sleep(cycles)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples), min(samples)


# ---- window close -------------------------------------------------------------------

class CloseSetup:
    """Parameters with .grad, fused AdamW and a GradScaler's device state."""

    def __init__(self, shapes, split_groups, bf16_copy):
        self.params = [torch.randn(s, device="cuda").requires_grad_() for s in shapes]
        for p in self.params:
            p.grad = torch.randn_like(p)
        self.grads = [p.grad for p in self.params]
        self.data = [p.detach() for p in self.params]
        self.grad_source = [torch.randn_like(g) for g in self.grads]
        if split_groups:  # nanoGPT's groups: no weight decay on biases and norm weights
            groups = [{"params": [p for p in self.params if p.dim() >= 2],
                       "weight_decay": WEIGHT_DECAY},
                      {"params": [p for p in self.params if p.dim() < 2], "weight_decay": 0.0}]
        else:
            groups = [{"params": self.params, "weight_decay": WEIGHT_DECAY}]
        self.opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)
        self.scale = torch.full((), INIT_SCALE, device="cuda")
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device="cuda")
        self.found_inf = torch.zeros((), device="cuda")
        # The fused step skips on device when found_inf is set, as GradScaler.step arranges.
        self.opt.found_inf = self.found_inf
        self.compute = [d.to(torch.bfloat16) for d in self.data] if bf16_copy else None

    def numel(self):
        return sum(p.numel() for p in self.params)

    def refill(self):
        torch._foreach_copy_(self.grads, self.grad_source)

    def norm(self):
        # What clip_grad_norm_ computes before it scales.
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(self.grads)))

    def adamw(self):
        self.opt.step()
        if self.compute is not None:
            torch._foreach_copy_(self.compute, self.data)

    def close(self):
        self.found_inf.zero_()
        inv_scale = self.scale.double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(self.grads, self.found_inf, inv_scale)
        torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM, foreach=True)
        self.adamw()
        torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf, GROWTH, BACKOFF,
                                 GROWTH_INTERVAL)
        torch._foreach_zero_(self.grads)


def close_cases():
    """Yields (name, shapes, split_groups, case)."""
    for case in CLOSE_CASES:
        yield f"window_close/gpt2_124M/{case}", gpt2_124m_shapes(), True, case
    for n in SWEEP:
        yield f"window_close/flat/n={n}/close", [(n,)], False, "close"


def run_close(timer, shapes, split_groups, case):
    setup = CloseSetup(shapes, split_groups, bf16_copy=case.endswith("bf16copy"))
    if case.startswith("close"):
        ms, ms_min = timer.time_ms(setup.close, prepare=setup.refill)
    elif case == "norm":
        ms, ms_min = timer.time_ms(setup.norm)
    else:
        ms, ms_min = timer.time_ms(setup.adamw)
    torch_bytes, accrue_bytes = CLOSE_CASES[case]
    n = setup.numel()
    return ms, ms_min, {"shape": [n], "dtype": "f32", "bytes": torch_bytes * n,
                        "floor_bytes": accrue_bytes * n, "params": n}


# ---- weight-gradient accumulation ------------------------------------------------------

WGRAD_VARIANTS = {  # name: fn(g, x, acc)
    "write": lambda g, x, acc: torch.mm(g.t(), x, out_dtype=torch.float32, out=acc),
    "write_bf16": lambda g, x, acc: torch.mm(g.t(), x),
    "accumulate": lambda g, x, acc: acc.add_(g.t() @ x),
    "unfused_f32_tmp": lambda g, x, acc: acc.add_(torch.mm(g.t(), x, out_dtype=torch.float32)),
    "unfused_bf16_tmp": lambda g, x, acc: acc.add_((g.t() @ x).float()),
    "accumulate_addmm": lambda g, x, acc: torch.addmm(acc, g.t(), x, out_dtype=torch.float32,
                                                      out=acc),
}


def check_wgrad_variant(variant):
    """None when the variant runs and gives dW (write) or acc + dW on a small case, else why not."""
    fn = WGRAD_VARIANTS[variant]
    g = torch.randn(256, 48, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, 40, device="cuda", dtype=torch.bfloat16)
    acc = torch.randn(48, 40, device="cuda")
    acc0 = acc.clone()
    try:
        result = fn(g, x, acc)
    except (TypeError, RuntimeError) as e:
        return f"not available in torch {torch.__version__}: {type(e).__name__}: {e}"[:200]
    product = g.float().t() @ x.float()
    if variant == "write_bf16":
        got, want = result.float(), product
    elif variant == "write":
        got, want = acc, product
    else:
        got, want = acc, acc0 + product
    error = (got - want).abs().max().item() / want.abs().max().item()
    return None if error < 1e-2 else f"wrong result in torch {torch.__version__} (rel. error {error:.2g})"


def wgrad_cases():
    """Yields (name, layer, out, in, tokens, variant)."""
    for layer, out, inn in WGRAD_SHAPES:
        for tokens in TOKENS:
            for variant in WGRAD_VARIANTS:
                yield (f"wgrad/bf16/{layer}_{out}x{inn}/T={tokens}/{variant}", layer, out, inn,
                       tokens, variant)


def run_wgrad(timer, out, inn, tokens, variant):
    g = torch.randn(tokens, out, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, inn, device="cuda", dtype=torch.bfloat16)
    acc = torch.randn(out, inn, device="cuda")  # already holds a gradient
    fn = WGRAD_VARIANTS[variant]
    ms, ms_min = timer.time_ms(lambda: fn(g, x, acc))
    return ms, ms_min, {"shape": [tokens, out, inn], "dtype": "bf16",
                        "flop": 2 * tokens * out * inn}


# ---- main ---------------------------------------------------------------------------

def copy_bandwidth(timer):
    """Device-to-device copy of 1 GiB, bytes read + written per second (as accrue_bench)."""
    n = 1 << 28
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    ms, _ = timer.time_ms(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--filter", default="", help="regex on benchmark names")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("torch_accumulation: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    def selected(name):
        return not args.filter or re.search(args.filter, name)

    gpu = torch.cuda.get_device_name()
    timer = Timer(args.warmup, args.repeats)
    copy_bytes_per_s = copy_bandwidth(timer)
    print(f"torch_accumulation: {gpu}, torch {torch.__version__}, "
          f"device-to-device copy {copy_bytes_per_s * 1e-9:.0f} GB/s")
    print(f"{'benchmark':<50} {'ms':>9} {'rate':>16} {'copy frac':>9}")
    results = []

    def record(name, op, ms, ms_min, extra):
        row = {"name": name, "op": op, "ms": ms, "ms_min": ms_min, "repeats": args.repeats}
        row.update(extra)
        if "bytes" in row:
            bytes_per_s = row["bytes"] / (ms * 1e-3)
            row["GB/s"] = bytes_per_s * 1e-9
            row["copy_frac"] = bytes_per_s / copy_bytes_per_s
            rate, frac = f"{row['GB/s']:.0f} GB/s", f"{row['copy_frac']:.2f}"
        else:
            row["TFLOP/s"] = row["flop"] / (ms * 1e-3) * 1e-12
            rate, frac = f"{row['TFLOP/s']:.1f} TFLOP/s", ""
        print(f"{name:<50} {ms:>9.3f} {rate:>16} {frac:>9}", flush=True)
        results.append(row)

    for name, shapes, split_groups, case in close_cases():
        if selected(name):
            ms, ms_min, extra = run_close(timer, shapes, split_groups, case)
            extra["recipe"] = case
            record(name, "window_close", ms, ms_min, extra)
            torch.cuda.empty_cache()

    unavailable = {}
    for name, layer, out, inn, tokens, variant in wgrad_cases():
        if not selected(name):
            continue
        if variant not in unavailable:
            unavailable[variant] = check_wgrad_variant(variant)
        if unavailable[variant]:
            print(f"{name:<50} skipped: {unavailable[variant]}", flush=True)
            results.append({"name": name, "op": "wgrad", "error": unavailable[variant]})
            continue
        ms, ms_min, extra = run_wgrad(timer, out, inn, tokens, variant)
        extra["recipe"] = variant
        record(name, "wgrad", ms, ms_min, extra)
        torch.cuda.empty_cache()

    report = {
        "context": {
            "gpu": gpu,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "copy_bandwidth_GBps": copy_bytes_per_s * 1e-9,
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

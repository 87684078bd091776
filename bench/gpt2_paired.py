#!/usr/bin/env python3
"""The PyTorch recipe and accrue.torch's window on GPT-2, interleaved window by window in one process.

    python3 bench/gpt2_paired.py --micro-batch 1 --k 32 --pairs 12
    torchrun --standalone --nproc-per-node=2 bench/gpt2_paired.py --micro-batch 8 --k 4  # DDP

Why paired: at small micro-batches an eager window is bound by the host's launches, and on a
shared host the speed of one process drifts by 10-40% from run to run, more than the two
recipes differ. Two separate runs then compare the host's moods, not the recipes. Here one
process builds the model twice from one seed and trains one copy with bench/torch_gpt2.py's
PyTorch recipe (bf16 autocast, clip_grad_norm_, fused AdamW; DDP with no_sync under
torchrun) and the other with its --accrue-bridge recipe (AccumulationWindow; its own reducer
under torchrun), on the same random tokens. After --warmup windows of each, --pairs pairs of
windows run back to back, each window between two CUDA events on the stream; the pairs
alternate which recipe goes first. Under torchrun each window's time is its slowest rank's.

Each pair gives a ratio, the recipe's window time over the bridge's (> 1: the bridge is
faster); the figure is the median of those ratios, beside each side's median and fastest
window and tokens/s. Host noise that lasts longer than a pair cancels in its ratio.

Options are torch_gpt2.py's (--model, --micro-batch, --k, --seq-len, --compile, --warmup,
--lr, --bucket-cap-mb, --cpu), plus --pairs. Prints one JSON line (rank 0).
"""
import argparse
import copy
import json
import statistics
import sys

import torch_gpt2 as tg


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--pairs", type=int, default=12, help="pairs of timed windows")
    p.add_argument("-h", "--help", action="store_true")
    own, rest = p.parse_known_args()
    if own.help:
        print(__doc__)
        sys.exit(0)
    if own.pairs < 1:
        sys.exit(f"gpt2_paired.py: --pairs {own.pairs} must be >= 1")
    for flag in ("--accrue-bridge", "--cuda-graphs", "--fp8", "--composed", "--windows"):
        if flag in rest:
            sys.exit(f"gpt2_paired.py: {flag} is not an option here (both recipes run, eagerly "
                     "or compiled, in bf16)")
    sys.argv = [sys.argv[0]] + rest
    args = tg.parse_args()  # torch_gpt2.py's options and checks
    if args.cpu and tg.launch_env()[0] > 1:
        sys.exit("gpt2_paired.py: --cpu runs on one process (the bridge all-reduces over NCCL)")
    args.pairs = own.pairs
    return args


def run(torch, args, world, rank, device):
    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def untimed_close(close):
        close()

    windows, losses = {}, {}
    for name, recipe in (("torch", tg.torch_recipe), ("accrue_bridge", tg.bridge_recipe)):
        torch.manual_seed(1234)  # both copies start from the same weights
        model, vocab = tg.build_model(torch, args)
        model = model.to(device)
        recipe_args = copy.copy(args)
        recipe_args.accrue_bridge = name == "accrue_bridge"
        window, last_loss, parallel, _ = recipe(torch, recipe_args, model, world, rank, device,
                                                vocab, autocast, untimed_close)
        windows[name], losses[name] = window, last_loss
    names = list(windows)
    for _ in range(args.warmup):
        for name in names:
            windows[name]()

    def mark():
        return tg.HostEvent() if args.cpu else torch.cuda.Event(enable_timing=True)

    stream = None if args.cpu else torch.cuda.current_stream(device)
    marks = {name: [] for name in names}
    for p in range(args.pairs):
        for name in (names if p % 2 == 0 else names[::-1]):
            start, end = mark(), mark()
            start.record(stream)
            windows[name]()
            end.record(stream)
            marks[name].append((start, end))
    if not args.cpu:
        torch.cuda.synchronize(device)
    ms = {name: tg.max_over_ranks(torch, [s.elapsed_time(e) for s, e in marks[name]], device)
          for name in names}
    ratios = [a / b for a, b in zip(ms["torch"], ms["accrue_bridge"])]
    tokens = args.micro_batch * args.k * args.seq_len * world
    row = {"bench": "gpt2_paired", "mode": "compile" if args.compile else "eager",
           "model": args.model, "world_size": world, "micro_batch": args.micro_batch,
           "K": args.k, "seq_len": args.seq_len, "pairs": args.pairs, "warmup": args.warmup,
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
           "ratio_max": max(ratios),
           "gpu": "cpu" if args.cpu else torch.cuda.get_device_name(device),
           "torch": torch.__version__}
    for name in names:
        median = statistics.median(ms[name])
        row[name] = {"window_ms": median, "window_ms_min": min(ms[name]),
                     "tokens_per_s": tokens / (median / 1e3), "loss": losses[name]()}
    return row


def main():
    args = parse_args()
    tg.run_on_ranks(args, run,
                    lambda world: {"bench": "gpt2_paired", "world_size": world,
                                   "micro_batch": args.micro_batch, "K": args.k},
                    "gpt2_paired.py", "use --cpu --model tiny to check the script")


if __name__ == "__main__":
    main()

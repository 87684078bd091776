#!/usr/bin/env python3
"""The health monitor's cost per window (the target: <= 1% of the window).

    python3 bench/monitor_overhead.py --accrue-bin build/gpu/examples/accrue_train_gpt2

Runs accrue_train_gpt2 --bench --synthetic (GPT-2 d12, bf16, micro-batch 8,
32 x 1024 tokens per window by default) once per option set below, the sets
interleaved over --repeats rounds so that a drift of the machine spreads over
all of them:

  none                     the report alone (loss, norms, scale, skips)
  noise every window       --noise-scale-every 1
  layers every 10th        --metrics F --layer-metrics-every 10 --noise-scale-every 10
  layers every window      --metrics F --layer-metrics-every 1

and prints each set's median window time (the median over the rounds of each
run's own median, each round starting one set later) and its cost against
`none`, with the 1% verdict and every run's figure. Per-layer
figures come from the close's own fused pass (Note [Step sums] in
kernels/window_close.h) unless --accrue-args holds --cuda-graphs, whose
captured close takes the separate passes (Note [Layer monitor]).
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bench import default_accrue_bin, last_json_line, run_logged  # noqa: E402

TARGET = 0.01  # the monitor costs at most 1% of a window


def option_sets(metrics_file):
    return [
        ("none", []),
        ("noise every window", ["--noise-scale-every", "1"]),
        ("layers every 10th", ["--metrics", metrics_file, "--layer-metrics-every", "10",
                               "--noise-scale-every", "10"]),
        ("layers every window", ["--metrics", metrics_file, "--layer-metrics-every", "1"]),
    ]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--accrue-bin", default=default_accrue_bin(),
                   help="accrue_train_gpt2 (default: the first one built)")
    p.add_argument("--model", default="d12", help="d12 | d24 | d36 | d48 | tiny")
    p.add_argument("--dtype", default="bf16", help="f32 | bf16 | f16")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--total-batch-tokens", type=int, default=32768)
    p.add_argument("--warmup", type=int, default=2, help="untimed windows per run")
    p.add_argument("--windows", type=int, default=10, help="timed windows per run")
    p.add_argument("--repeats", type=int, default=3, help="rounds over the option sets")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--accrue-args", default="", help="extra options for every run")
    p.add_argument("--out", help="also write the markdown table to this file")
    p.add_argument("--log-dir", help="keep each run's stdout/stderr here")
    args = p.parse_args()
    for name in ("micro_batch", "seq_len", "total_batch_tokens", "windows", "repeats", "timeout"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be at least 0, got {args.warmup}")
    return args


def command(args, extra):
    return [args.accrue_bin, "--bench", "--synthetic", "--model", args.model, "--dtype",
            args.dtype, "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch),
            "--total-batch-tokens", str(args.total_batch_tokens),
            "--bench-warmup", str(args.warmup), "--bench-windows", str(args.windows)
            ] + args.accrue_args.split() + extra


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sets = option_sets(os.path.join(tmp, "metrics.jsonl"))
        times = {name: [] for name, _ in sets}
        device = "unknown device"
        for r in range(args.repeats):
            # Each round starts one set later, so no set always runs first
            # (on a cool GPU) or right after the same neighbour.
            shift = r % len(sets)
            for name, extra in sets[shift:] + sets[:shift]:
                tag = f"{name.replace(' ', '_')}_{r}"
                status, out, err, _ = run_logged(command(args, extra), args.timeout,
                                                 args.log_dir, tag)
                row = last_json_line(out)
                if status != 0 or row is None or "window_ms_median" not in row:
                    sys.exit(f"monitor_overhead: '{name}' (round {r}) failed with exit {status}: "
                             f"{(err or out).strip().splitlines()[-1:] or ['no output']}")
                times[name].append(float(row["window_ms_median"]))
                device = str(row.get("device", device))
    base = statistics.median(times["none"])
    lines = [f"accrue_train_gpt2 --model {args.model} --dtype {args.dtype} --micro-batch "
             f"{args.micro_batch} --total-batch-tokens {args.total_batch_tokens} "
             f"{args.accrue_args}".rstrip() + f"; {device}; median of {args.repeats} runs "
             f"of {args.windows} windows",
             "",
             "| options | window ms | vs none | <= 1% | each run's median (ms) |",
             "|---|---:|---:|---|---|"]
    for name, _ in sets:
        ms = statistics.median(times[name])
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        if name == "none":
            lines.append(f"| {name} | {ms:.3f} | — | | {runs} |")
            continue
        cost = ms / base - 1.0
        lines.append(f"| {name} | {ms:.3f} | {cost * 100:+.2f}% | "
                     f"{'met' if cost <= TARGET else 'MISSED'} | {runs} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

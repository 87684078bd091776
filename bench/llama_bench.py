#!/usr/bin/env python3
"""Llama training throughput: accrue beside PyTorch eager, torch.compile and transformers.

    python3 bench/llama_bench.py --accrue-bin build/gpu/examples/accrue_train \\
        --out llama.md --json llama.json --log-dir llama_logs
    python3 bench/llama_bench.py --nproc 2 ...            # the 2-GPU table instead
    python3 bench/llama_bench.py --dry-run                # the commands, nothing run

One GPU (the default). For each model of --models and each (B, K) point
(default: the issue's, below; --points BxK,... for every model), runs, each in
its own subprocess with a time limit (--timeout), one after the other:

  accrue:        accrue_train --bench --synthetic --synthetic-documents full --model M
                     --dtype bf16 --seq-len 2048 --micro-batch B --accum K
                     --bench-warmup W --bench-windows N [--accrue-args, e.g. --cuda-graphs]
  eager:         bench/torch_llama.py --model M --micro-batch B --k K --seq-len 2048 ...
  compile:       the same with --compile              (--skip-compile leaves it out)
  transformers:  the same with --impl transformers    (--skip-transformers)

    llama-125m   global 64 sequences of 2048: (32,2), (8,8), (2,32), (1,64)
    llama3.2-1b  global 32 sequences of 2048: (8,4), (2,16), (1,32)

and prints a markdown table per model (and writes them with --out): tokens/s
of each, accrue / eager and accrue / compile with the targets (accrue >= 1.3x
eager and >= 1.1x torch.compile tokens/s at every point; accrue's peak memory
<= eager's) as PASS/MISS columns, MFU of each, peak memory of each, and the
MFU target (accrue >= 50% at llama3.2-1b micro-batch 8, set for an H200).

MFU is computed here for every run with one formula, accrue_train's
(Note [Llama FLOPs per token] in examples/common/train_model.cpp; torch_llama.py's
flops_per_token writes it out):

    6 (L (d q + 2 d kv + q d + 3 d f) + d V)  +  12 L h hd T   FLOPs per token

(every weight matmul, the output layer included, tied or not; attention's
scores and PV over T keys, causal masking not discounted) against the GPU's
dense bf16 peak (torch_gpt2.py's table, or --peak-tflops); a run's own MFU
stays in the --json rows ("reported_mfu"). accrue's JSON line is read as gpt2_bench.py
reads accrue_train_gpt2's (tokens_per_s_median, window_ms_median,
peak_memory_bytes, ...; the same keys under other common names accepted).

Two GPUs (--nproc N, N >= 2): llama3.2-1b (--models) at (8,4) and (2,16)
(--points), each GPU B x K sequences per window, as bench/gpt2_dp_bench.py:

  accrue, 1 GPU;  accrue, N GPUs: torchrun --standalone --nproc-per-node=N --no-python
  accrue_train ... (the same --accum K on every rank: the global batch grows N-fold);
  accrue ZeRO-1, N GPUs: the same plus --zero1-args (default --zero1; '' leaves it out);
  PyTorch, 1 GPU: torch_llama.py;  PyTorch DDP, N GPUs: torchrun torch_llama.py (no_sync
  for the first K - 1 micro-steps);  PyTorch FSDP2, N GPUs: torchrun torch_llama.py --fsdp
  (--skip-fsdp leaves it out)

with the targets accrue N GPUs >= 1.95x accrue 1 GPU and >= 1.2x PyTorch DDP
(and FSDP2) tokens/s, and peak memory per rank (accrue's is rank 0's, the one
that prints; PyTorch's the largest over ranks).

Every child runs with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 (NVLink multicast stays off on shared machines) and
without the launcher variables this script inherited (RANK, WORLD_SIZE, ...),
so 1-GPU runs are world size 1. A 2-GPU accrue run whose TCP exchange could
not listen on MASTER_PORT + 1 is run once more.

--ncu-points MODEL:BxK,... adds where accrue's time goes (the issue asks for
the largest and smallest micro-batch): accrue_train under Nsight Compute
(ncu --profile-from-start off --clock-control none --cache-control none
--metrics gpu__time_duration.sum, the one timed window after one warm-up,
which the trainer brackets with cudaProfilerStart/Stop, of at most
--ncu-max-k micro-batches: the same kernels each, so the close's share
grows as K is cut, and the table says so), its kernels summed by class (GEMM,
attention, norms, RoPE, SwiGLU, classifier, window close, elementwise,
other), as gpt2_bench.py does for GPT-2.

A device call has a time limit: --json is rewritten after every run, --resume
reads it back and runs only what is not there yet (a failed run other than
out-of-memory is run again), and --stop-after S starts no run after S
seconds (the rest show as "not run"), so one long measurement can be spread
over calls; --table-only prints the tables of --json and runs nothing.
--dry-run prints every command and runs nothing. --cpu runs both sides on the
CPU (accrue_train --cpu, torch_llama.py --device cpu) to check this script
without a GPU: e.g. --cpu --models llama-tiny --points 2x2 --seq-len 64.
Exit status: 0 when every accrue run gave a figure (or nothing ran), else 1.
"""
import argparse
import json
import os
import re
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bench import (FP8_CASTS, NCU_TIMED_ONLY, default_accrue_bin, find_ncu,  # noqa: E402
                        fmt, fmt_rate, gpu_name, last_window, ok, parse_ncu_csv, parse_points,
                        run_logged, short_name)
from gpt2_bench import classify as first_class  # noqa: E402
from gpt2_dp_bench import CHILD_ENV, LAUNCHER_VARS, run_and_read, why_failed  # noqa: E402
import torch_gpt2  # noqa: E402  (the peak table; imports no torch)
import torch_llama  # noqa: E402  (the presets and the FLOP count; imports no torch)

SEQ_LEN = 2048
DEFAULT_MODELS = ["llama-125m", "llama3.2-1b"]
DEFAULT_POINTS = {"llama-125m": [(32, 2), (8, 8), (2, 32), (1, 64)],
                  "llama3.2-1b": [(8, 4), (2, 16), (1, 32)]}
DP_MODELS = ["llama3.2-1b"]
DP_POINTS = [(8, 4), (2, 16)]
EAGER_TARGET = 1.3
COMPILE_TARGET = 1.1
MFU_TARGET = (0.50, "llama3.2-1b", 8)  # (fraction, model, micro-batch), set for an H200
DP_SCALING_TARGET = 1.95
DP_TORCH_TARGET = 1.2

# impl -> (label, world size is N): the runs of each point.
SINGLE_RUNS = [("accrue", "accrue"), ("torch_eager", "PyTorch eager"),
               ("torch_compile", "torch.compile"), ("transformers", "transformers eager")]
DP_RUNS = [("accrue", 1, "accrue 1 GPU"), ("accrue", "N", "accrue N GPUs"),
           ("accrue_zero1", "N", "accrue ZeRO-1 N GPUs"), ("torch", 1, "PyTorch 1 GPU"),
           ("torch_ddp", "N", "PyTorch DDP N GPUs"), ("torch_fsdp", "N", "PyTorch FSDP2 N GPUs")]

# Kernel classes of the ncu breakdown: the first class any of whose substrings
# is in the lower-cased kernel name wins (the close and the classifier before
# GEMM; attention before GEMM and softmax; cuDNN's attention kernels name sdpa
# or flash; gpt2_bench's FP8 casts before elementwise).
NCU_CLASSES = [
    ("window close", ["fused_optimizer", "grad_norm_partials", "window_scalar", "adam",
                      "multi_tensor"]),
    ("classifier", ["classifier", "cross_entropy", "loss_total"]),
    ("attention", ["cudnn", "sdpa", "flash", "fmha", "attention", "softmax", "score_grad",
                   "backward_rows", "forward_combine", "backward_combine"]),
    ("norms", ["rms_norm", "layer_norm", "rmsnorm"]),
    ("RoPE", ["rope", "rotary"]),
    ("SwiGLU", ["swiglu", "silu"]),
    ("GEMM", ["nvjet", "gemm", "cutlass", "xmma", "cublas", "splitk", "matmul"]),
    FP8_CASTS,
    ("elementwise", ["map_contiguous", "map_strided", "elementwise", "copy", "fill", "scale",
                     "add_scaled", "cast", "vectorized", "embedding"]),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--accrue-bin", default=default_accrue_bin("accrue_train"),
                   help="the accrue_train binary (default: the first built one found)")
    p.add_argument("--models", default=None,
                   help="comma-separated presets (default: llama-125m,llama3.2-1b; "
                        "with --nproc: llama3.2-1b)")
    p.add_argument("--points", default=None,
                   help="BxK points for every model (default: each model's, see above)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--nproc", type=int, default=1,
                   help="N >= 2: the N-GPU table (accrue under torchrun, DDP, FSDP2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed windows per run")
    p.add_argument("--windows", type=int, default=5, help="timed windows per run")
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--stop-after", type=float, default=None, metavar="S",
                   help="start no run after S seconds (the rest: not run; see --resume)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that runs torch_llama.py (default: this one)")
    p.add_argument("--torchrun", default=None,
                   help="the torchrun command (default: --python -m torch.distributed.run)")
    p.add_argument("--documents", default="full", choices=["full", "random"],
                   help="accrue_train's --synthetic-documents: full (each row one causal "
                        "sequence, as PyTorch trains) or random (packed documents)")
    p.add_argument("--accrue-args", default="",
                   help="extra options for accrue_train (e.g. --cuda-graphs)")
    p.add_argument("--zero1-args", default="--zero1",
                   help="with --nproc: accrue_train's options for the ZeRO-1 run ('' for none)")
    p.add_argument("--torch-args", default="", help="extra options for torch_llama.py")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument("--skip-torch", action="store_true", help="accrue only")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile runs")
    p.add_argument("--skip-transformers", action="store_true", help="no transformers runs")
    p.add_argument("--skip-fsdp", action="store_true", help="with --nproc: no FSDP2 runs")
    p.add_argument("--ncu-points", default="",
                   help="MODEL:BxK,... where accrue's kernel time is broken down under Nsight "
                        "Compute (e.g. llama-125m:32x2,llama-125m:1x64,llama3.2-1b:8x4,"
                        "llama3.2-1b:1x32; default none)")
    p.add_argument("--ncu", default=None, help="the ncu binary (default: from PATH or CUDA)")
    p.add_argument("--ncu-timeout", type=int, default=420, help="seconds per ncu run")
    p.add_argument("--ncu-max-k", type=int, default=16,
                   help="profile a window of at most this many micro-batches (0: the point's K)")
    p.add_argument("--cpu", action="store_true",
                   help="both sides on the CPU (tiny models): checks this script")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--resume", action="store_true",
                   help="keep --json's rows and run only the missing or failed ones")
    p.add_argument("--table-only", action="store_true",
                   help="print the tables of --json's rows, run nothing")
    p.add_argument("--out", help="write the markdown tables to this file")
    p.add_argument("--json", help="write every run's parsed row here (a list), after each run")
    p.add_argument("--log-dir", help="keep each run's command, stdout and stderr here")
    args = p.parse_args(argv)
    dp = args.nproc >= 2
    if args.nproc < 1:
        p.error(f"--nproc {args.nproc} must be >= 1")
    models = args.models.split(",") if args.models else (DP_MODELS if dp else DEFAULT_MODELS)
    args.models = [m.strip() for m in models if m.strip()]
    for m in args.models:
        if m not in torch_llama.PRESETS:
            known = ", ".join(sorted(torch_llama.PRESETS))
            p.error(f"--models: unknown model {m!r}; known: {known}")
    if args.points is not None:
        points = parse_points(args.points)
        args.points = {m: points for m in args.models}
    else:
        args.points = {m: DP_POINTS if dp else DEFAULT_POINTS.get(m, [(8, 4)])
                       for m in args.models}
    if args.warmup < 0 or args.windows < 1 or args.timeout < 1 or args.seq_len < 2:
        p.error("--warmup must be >= 0, --windows and --timeout >= 1, --seq-len >= 2")
    for m in args.models:
        if args.seq_len > torch_llama.PRESETS[m]["max_positions"]:
            p.error(f"--seq-len {args.seq_len} is past {m}'s "
                    f"{torch_llama.PRESETS[m]['max_positions']} positions")
    ncu_points = []
    for item in (x.strip() for x in args.ncu_points.split(",")):
        if not item:
            continue
        model, _, point = item.rpartition(":")
        if model not in torch_llama.PRESETS:
            p.error(f"--ncu-points {item!r}: write MODEL:BxK with a known model")
        ncu_points += [(model, b, k) for b, k in parse_points(point)]
    args.ncu_points = ncu_points
    if (args.resume or args.table_only) and not args.json:
        p.error("--resume and --table-only read --json FILE")
    if args.torchrun is None:
        args.torchrun = f"{shlex.quote(args.python)} -m torch.distributed.run"
    return args


def child_environment():
    """Sets this process's environment to what every child must see (run_logged passes it on)."""
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    os.environ.update(CHILD_ENV)


# ---- commands --------------------------------------------------------------------------------

def accrue_cmd(args, model, b, k):
    cmd = [args.accrue_bin, "--bench", "--synthetic", "--synthetic-documents", args.documents,
           "--model", model, "--dtype", "bf16", "--seq-len", str(args.seq_len),
           "--micro-batch", str(b), "--accum", str(k),
           "--bench-warmup", str(args.warmup), "--bench-windows", str(args.windows)]
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    if args.cpu:
        cmd.append("--cpu")
    return cmd + shlex.split(args.accrue_args)


def torch_cmd(args, model, b, k, extra=()):
    cmd = [args.python, os.path.join(HERE, "torch_llama.py"), "--model", model,
           "--micro-batch", str(b), "--k", str(k), "--seq-len", str(args.seq_len),
           "--warmup", str(args.warmup), "--windows", str(args.windows)] + list(extra)
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    if args.cpu:
        cmd += ["--device", "cpu"]
    return cmd + shlex.split(args.torch_args)


def command(args, impl, world, model, b, k):
    """The command line of one run (None: this run is left out)."""
    torchrun = shlex.split(args.torchrun) + ["--standalone", f"--nproc-per-node={world}"]
    if impl in ("accrue", "accrue_zero1"):
        cmd = accrue_cmd(args, model, b, k)
        if impl == "accrue_zero1":
            if not args.zero1_args.strip():
                return None
            cmd += shlex.split(args.zero1_args)
        return cmd if world == 1 else torchrun + ["--no-python"] + cmd
    extra = {"torch_eager": [], "torch": [], "torch_ddp": [], "torch_compile": ["--compile"],
             "transformers": ["--impl", "transformers"], "torch_fsdp": ["--fsdp"]}[impl]
    cmd = torch_cmd(args, model, b, k, extra)  # [python, torch_llama.py, ...]
    return cmd if world == 1 else torchrun + cmd[1:]


def planned_runs(args):
    """[(impl, world, label, model, b, k)] in the order they run."""
    runs = []
    for model in args.models:
        for b, k in args.points[model]:
            if args.nproc >= 2:
                for impl, world, label in DP_RUNS:
                    if impl.startswith("torch") and args.skip_torch:
                        continue
                    if impl == "torch_fsdp" and args.skip_fsdp:
                        continue
                    if impl == "accrue_zero1" and not args.zero1_args.strip():
                        continue
                    n = args.nproc if world == "N" else 1
                    runs.append((impl, n, label.replace("N GPUs", f"{n} GPUs"), model, b, k))
            else:
                for impl, label in SINGLE_RUNS:
                    if impl != "accrue" and args.skip_torch:
                        continue
                    if (impl == "torch_compile" and args.skip_compile) or (
                            impl == "transformers" and args.skip_transformers):
                        continue
                    runs.append((impl, 1, label, model, b, k))
    return runs


# ---- running ---------------------------------------------------------------------------------

def key(row):
    return (row["impl"], row["world_size"], row["model"], row["micro_batch"], row["K"])


def run_one(args, run, gpu):
    """One run; returns its row (errors are rows too)."""
    impl, world, label, model, b, k = run
    tag = f"{impl}_{model}_{world}gpu_{b}x{k}"
    cmd = command(args, impl, world, model, b, k)
    if world > 1:
        # On a timeout torchrun gets SIGTERM and stops its workers itself.
        cmd = ["timeout", "--kill-after=60", str(args.timeout)] + cmd
    print(f"[llama_bench] {tag}: {shlex.join(cmd)}", flush=True)
    row = {"impl": impl, "label": label, "model": model, "world_size": world, "micro_batch": b,
           "K": k, "seq_len": args.seq_len, "cmd": cmd}
    seconds = run_and_read(cmd, args.timeout + (90 if world > 1 else 0), args.log_dir, tag, row,
                           world, impl.startswith("accrue"), args.timeout, "accrue_train",
                           "llama_bench")
    if ok(row):
        peak = args.peak_tflops or torch_gpt2.peak_tflops(gpu)
        if peak:  # per GPU
            row["mfu"] = (row["tokens_per_s"] * torch_llama.flops_per_token(model, args.seq_len)
                          / (peak * 1e12 * world))
        mem = row["peak_mem_gib"]
        print(f"[llama_bench] {tag}: {row['tokens_per_s']:,.0f} tokens/s, peak "
              f"{fmt(mem, '.2f', 'no figure')} GiB ({seconds:.0f} s)", flush=True)
    else:
        print(f"[llama_bench] {tag}: {row['error']} ({seconds:.0f} s)", flush=True)
    return row


# ---- the ncu breakdown -----------------------------------------------------------------------

def classify(name):
    return first_class(name, NCU_CLASSES)


def ncu_k(args, k):
    """The micro-batches of the profiled window: at most --ncu-max-k."""
    return min(k, args.ncu_max_k) if args.ncu_max_k > 0 else k


def ncu_cmd(args, model, b, k):
    ncu = find_ncu(args.ncu) or "ncu"
    # A window at large K is tens of thousands of kernels, each serialized and
    # timed (about 10 ms each under ncu on an H200: 1 x 64 at llama-125m,
    # some 42,000 kernels, passed 200 s): the window is cut to --ncu-max-k
    # micro-batches, which run the same kernels as the point's. Only the
    # timed window is profiled (Note [Profiled span]); the warm-up runs at speed.
    k = ncu_k(args, k)
    cmd = accrue_cmd(args, model, b, k)
    at = cmd.index("--bench-warmup")
    cmd[at + 1], cmd[at + 3] = "1", "1"
    return [ncu] + NCU_TIMED_ONLY + ["--clock-control", "none", "--cache-control", "none",
                                    "--metrics", "gpu__time_duration.sum", "--csv",
                                    "--print-units", "base"] + cmd


def run_ncu(args, model, b, k):
    """accrue's kernels at one point under ncu, summed by class; a row (impl "ncu")."""
    tag = f"ncu_accrue_{model}_{b}x{k}"
    cmd = ncu_cmd(args, model, b, k)
    print(f"[llama_bench] {tag}: {shlex.join(cmd)}", flush=True)
    row = {"impl": "ncu", "label": "ncu accrue", "model": model, "world_size": 1,
           "micro_batch": b, "K": k, "profiled_K": ncu_k(args, k), "cmd": cmd}
    status, out, err, seconds = run_logged(cmd, args.ncu_timeout, args.log_dir, tag)
    kernels = parse_ncu_csv(out)
    row.update(seconds=round(seconds, 1), exit=status)
    if not kernels:
        reason = "timed out" if status is None else f"exit {status}"
        row["error"] = (f"ncu: no kernel durations ({reason}): "
                        f"{why_failed(err, 'accrue_train') or why_failed(out, 'accrue_train')}")
        print(f"[llama_bench] {tag}: {row['error']}", flush=True)
        return row
    window, note = last_window(kernels, timed_only=True)
    by_class, others = {}, {}
    for name, ns in window:
        cls = classify(name)
        count, total = by_class.get(cls, (0, 0.0))
        by_class[cls] = (count + 1, total + ns)
        if cls == "other":
            others[short_name(name)] = others.get(short_name(name), 0.0) + ns
    row["breakdown"] = {"note": note, "kernels": len(window),
                        "classes": {c: {"kernels": n, "ns": t} for c, (n, t) in by_class.items()},
                        "other_largest": sorted(others.items(), key=lambda kv: -kv[1])[:8]}
    print(f"[llama_bench] {tag}: {len(kernels)} kernels profiled in {seconds:.0f} s", flush=True)
    return row


def ncu_tables(rows, args):
    lines = []
    for r in rows:
        if r["impl"] != "ncu" or "breakdown" not in r:
            continue
        bd = r["breakdown"]
        total = sum(c["ns"] for c in bd["classes"].values())
        k, profiled = r["K"], r.get("profiled_K", r["K"])
        cut = ("" if profiled == k else
               f"; a window of {profiled} micro-batches, not {k} (--ncu-max-k): the same "
               f"kernels a micro-batch, the close once a window, so {k // profiled}x its "
               f"share at the full K")
        lines += ["", f"accrue {r['model']} at {r['micro_batch']} x {k}: kernel time by "
                      f"class over one window ({bd['note']}; {bd['kernels']} kernels, "
                      f"{total / 1e6:.2f} ms of GPU time under ncu{cut})", "",
                  "| class | kernels | ms | share |", "|---|---:|---:|---:|"]
        for cls in [c for c, _ in NCU_CLASSES] + ["other"]:
            c = bd["classes"].get(cls, {"kernels": 0, "ns": 0.0})
            share = c["ns"] / total if total else 0.0
            lines.append(f"| {cls} | {c['kernels']} | {c['ns'] / 1e6:.2f} | {share:.1%} |")
        if bd["other_largest"]:
            lines += ["", "largest kernels in 'other': " + "; ".join(
                f"{n} {ns / 1e6:.2f} ms" for n, ns in bd["other_largest"])]
    return lines


# ---- tables ----------------------------------------------------------------------------------

def ratio(a, b):
    return a["tokens_per_s"] / b["tokens_per_s"] if ok(a) and ok(b) else None


def speed_verdict(a, t, target):
    """(ratio text, PASS/MISS text) of accrue row a against row t for a tokens/s target."""
    if t is None:
        return "–", "–"
    if not ok(a):
        return "–", "MISS (accrue failed)" if a is not None else "–"
    if not ok(t):
        if t.get("error") == "out of memory":
            return "∞ (PyTorch OOM)", "PASS (PyTorch OOM)"
        return "–", "– (PyTorch failed)"
    r = ratio(a, t)
    return f"{r:.2f}x", "PASS" if r >= target else "MISS"


def memory_verdict(a, t):
    if t is None or a is None:
        return "–"
    if not ok(a):
        return "MISS (accrue failed)"
    if not ok(t):
        return "PASS (PyTorch OOM)" if t.get("error") == "out of memory" else "– (PyTorch failed)"
    if a["peak_mem_gib"] is None or t["peak_mem_gib"] is None:
        return "– (no figure)"
    return "PASS" if a["peak_mem_gib"] <= t["peak_mem_gib"] else "MISS"


def fmt_mfu(row):
    if not ok(row):
        return "–"
    if row.get("mfu") is not None:
        return f"{row['mfu']:.1%}"
    if row.get("reported_mfu") is not None:
        return f"{row['reported_mfu']:.1%} (own)"
    return "–"


def gib(row):
    return fmt((row or {}).get("peak_mem_gib") if ok(row) else None, ".2f")


def store_gib(row):
    """accrue's parameter store on its rank (store_memory_bytes.total), GiB."""
    store = ((row or {}).get("raw") or {}).get("store_memory_bytes")
    total = store.get("total") if isinstance(store, dict) else None
    return fmt(total / 2**30 if isinstance(total, (int, float)) and ok(row) else None, ".2f")


def single_tables(rows, args, gpu):
    by = {key(r): r for r in rows}
    lines, counts = [], {"eager": [0, 0], "compile": [0, 0], "memory": [0, 0]}
    for model in args.models:
        c = torch_llama.PRESETS[model]
        lines += [
            "", f"{model} ({torch_llama.parameter_count(c) / 1e6:,.1f}M parameters), bf16, "
                f"sequences of {args.seq_len} tokens, on {gpu}: tokens/s",
            "",
            "| B x K | accrue | PyTorch eager | torch.compile | transformers | accrue / eager "
            f"| >= {EAGER_TARGET}x eager | accrue / compile | >= {COMPILE_TARGET}x compile "
            "| accrue MFU | eager MFU | compile MFU | transformers MFU | accrue GiB | eager GiB "
            "| compile GiB | transformers GiB | memory <= eager |",
            "|---|---:|---:|---:|---:|---:|---|---:|---|" + "---:|" * 8 + "---|",
        ]
        for b, k in args.points[model]:
            a, e, cc, t = (by.get((impl, 1, model, b, k)) for impl in
                           ("accrue", "torch_eager", "torch_compile", "transformers"))
            er, ev = speed_verdict(a, e, EAGER_TARGET)
            cr, cv = speed_verdict(a, cc, COMPILE_TARGET)
            mv = memory_verdict(a, e)
            for name, verdict in (("eager", ev), ("compile", cv), ("memory", mv)):
                if verdict.startswith(("PASS", "MISS")):
                    counts[name][1] += 1
                    counts[name][0] += verdict.startswith("PASS")
            lines.append(
                f"| {b} x {k} | {fmt_rate(a)} | {fmt_rate(e)} | {fmt_rate(cc)} | {fmt_rate(t)} "
                f"| {er} | {ev} | {cr} | {cv} | {fmt_mfu(a)} | {fmt_mfu(e)} | {fmt_mfu(cc)} "
                f"| {fmt_mfu(t)} | {gib(a)} | {gib(e)} | {gib(cc)} | {gib(t)} | {mv} |")
    lines.append("")
    target, model, b = MFU_TARGET
    mfu_rows = [r for r in rows if r["impl"] == "accrue" and r["world_size"] == 1
                and r["model"] == model and r["micro_batch"] == b]
    h200 = "" if "H200" in gpu else f" (the target is set for an H200; this is {gpu})"
    if not mfu_rows:
        lines.append(f"MFU >= {target:.0%} at {model} micro-batch {b}: not run")
    for r in mfu_rows:
        m = r.get("mfu") if ok(r) else None
        verdict = "– (no figure)" if m is None else ("PASS" if m >= target else "MISS")
        lines.append(f"MFU >= {target:.0%} at {model} micro-batch {b} (K = {r['K']}): "
                     f"{fmt(m, '.1%')} {verdict}{h200}")
    parts = [f"{name} {counts[name][0]} of {counts[name][1]}"
             for name in ("eager", "compile", "memory") if counts[name][1]]
    lines.append("targets PASS: " + ("; ".join(parts) if parts else "nothing to compare"))
    lines.append("MFU: accrue_train's FLOPs per token (Note [Llama FLOPs per token]) for every "
                 "run, against the dense bf16 peak; 'own' marks a run's own figure where this "
                 "one has none.")
    return lines


def dp_tables(rows, args, gpu):
    by = {key(r): r for r in rows}
    n = args.nproc
    lines = []
    for model in args.models:
        lines += [
            "", f"{model}, bf16, sequences of {args.seq_len}, {n} GPUs beside 1, on {gpu}: each "
                f"GPU B x K sequences per window; tokens/s over all GPUs",
            "",
            f"| B x K | accrue 1 GPU | accrue {n} GPUs | accrue {n}/1 | >= {DP_SCALING_TARGET}x "
            f"| accrue ZeRO-1 {n} GPUs | PyTorch 1 GPU | DDP {n} GPUs | FSDP2 {n} GPUs "
            f"| accrue / DDP | >= {DP_TORCH_TARGET}x DDP | accrue / FSDP2 "
            f"| >= {DP_TORCH_TARGET}x FSDP2 |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for b, k in args.points[model]:
            a1, an, az, t1, td, tf = (by.get((impl, w, model, b, k)) for impl, w in
                                      (("accrue", 1), ("accrue", n), ("accrue_zero1", n),
                                       ("torch", 1), ("torch_ddp", n), ("torch_fsdp", n)))
            sr, sv = speed_verdict(an, a1, DP_SCALING_TARGET)
            if a1 is not None and not ok(a1):
                sr, sv = "–", "– (accrue 1 GPU failed)"
            dr, dv = speed_verdict(an, td, DP_TORCH_TARGET)
            fr, fv = speed_verdict(an, tf, DP_TORCH_TARGET)
            lines.append(f"| {b} x {k} | {fmt_rate(a1)} | {fmt_rate(an)} | {sr} | {sv} "
                         f"| {fmt_rate(az)} | {fmt_rate(t1)} | {fmt_rate(td)} | {fmt_rate(tf)} "
                         f"| {dr} | {dv} | {fr} | {fv} |")
        lines += ["", f"{model}: peak memory per GPU, GiB (accrue: rank 0's; PyTorch: the "
                      f"largest over ranks); accrue's parameter store per rank (master, "
                      f"gradients, compute copy, moments: store_memory_bytes)", "",
                  f"| B x K | accrue 1 GPU | accrue {n} GPUs | accrue ZeRO-1 {n} GPUs "
                  f"| PyTorch 1 GPU | DDP {n} GPUs | FSDP2 {n} GPUs | accrue store {n} GPUs "
                  f"| ZeRO-1 store {n} GPUs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b, k in args.points[model]:
            cells = [gib(by.get((impl, w, model, b, k))) for impl, w in
                     (("accrue", 1), ("accrue", n), ("accrue_zero1", n), ("torch", 1),
                      ("torch_ddp", n), ("torch_fsdp", n))]
            cells += [store_gib(by.get((impl, n, model, b, k)))
                      for impl in ("accrue", "accrue_zero1")]
            lines.append(f"| {b} x {k} | " + " | ".join(cells) + " |")
    return lines


def tables(rows, args, gpu):
    lines = dp_tables(rows, args, gpu) if args.nproc >= 2 else single_tables(rows, args, gpu)
    lines += ncu_tables(rows, args)
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += [""] + [f"{r['label']} {r['model']} at {r['micro_batch']} x {r['K']}: "
                         f"{r['error']}" for r in failed]
    return lines[1:] if lines and lines[0] == "" else lines


# ---- main ------------------------------------------------------------------------------------

def save_rows(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    child_environment()
    rows = []
    if (args.resume or args.table_only) and os.path.exists(args.json):
        with open(args.json) as f:
            rows = [r for r in json.load(f) if isinstance(r, dict) and "impl" in r]
    if args.cpu:
        gpu = "cpu"
    elif args.dry_run:
        gpu = "(dry run)"
    elif rows and args.table_only:
        gpu = next((r["raw"].get("gpu") or r["raw"].get("device") for r in rows
                    if r.get("raw", {}).get("gpu") or r.get("raw", {}).get("device")), "?")
    else:
        gpu = gpu_name()
    if not (args.dry_run or args.table_only) and not os.access(args.accrue_bin, os.X_OK):
        print(f"[llama_bench] warning: {args.accrue_bin} is not an executable; its runs will "
              f"fail (--accrue-bin)", flush=True)
    start = time.time()
    if not args.table_only:
        # Kept from --resume: every figure, and the out-of-memory rows (they would fail again).
        done = {key(r) for r in rows if ok(r) or r.get("error") == "out of memory"
                or "breakdown" in r}
        rows = [r for r in rows if key(r) in done]
        plan = planned_runs(args) + [("ncu", 1, "ncu accrue", m, b, k)
                                     for m, b, k in args.ncu_points]
        for run in plan:
            impl, world, label, model, b, k = run
            if (impl, world, model, b, k) in done:
                print(f"[llama_bench] {impl}_{model}_{world}gpu_{b}x{k}: kept from {args.json}",
                      flush=True)
                continue
            if args.dry_run:
                cmd = (ncu_cmd(args, model, b, k) if impl == "ncu"
                       else command(args, impl, world, model, b, k))
                if world > 1:
                    cmd = ["timeout", "--kill-after=60", str(args.timeout)] + cmd
                print(f"[llama_bench] {impl}_{model}_{world}gpu_{b}x{k}: {shlex.join(cmd)}",
                      flush=True)
                continue
            if args.stop_after is not None and time.time() - start > args.stop_after:
                print(f"[llama_bench] {impl}_{model}_{world}gpu_{b}x{k}: not run (--stop-after "
                      f"{args.stop_after:g} s reached)", flush=True)
                continue
            rows.append(run_ncu(args, model, b, k) if impl == "ncu" else run_one(args, run, gpu))
            if args.json:
                save_rows(args.json, rows)

    text = "\n".join(tables(rows, args, gpu))
    print("\n" + text, flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json and not (args.dry_run or args.table_only):
        save_rows(args.json, rows)
    accrue_rows = [r for r in rows if r["impl"].startswith("accrue")]
    return 0 if all(ok(r) for r in accrue_rows) else 1


if __name__ == "__main__":
    sys.exit(main())

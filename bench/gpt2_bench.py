#!/usr/bin/env python3
"""GPT-2 training throughput: accrue beside PyTorch on one GPU, and where accrue's time goes.

    python3 bench/gpt2_bench.py --accrue-bin build/gpu/examples/accrue_train_gpt2 --out gpt2.md

Runs, each in its own subprocess, one after the other on the same GPU:

  accrue_train_gpt2 --bench --synthetic --model d12 --dtype bf16 --seq-len 1024
      --micro-batch B --total-batch-tokens 32768 (K = 32 / B) --bench-warmup W --bench-windows N
  bench/torch_gpt2.py --micro-batch B --k K (eager)

at (B, K) = (32,1), (16,2), (8,4), (4,8), (2,16), (1,32) (--points), and
torch_gpt2.py --compile at (16,2) (--compile-points); --d48 B adds GPT-2 1.5B
at micro-batch B (K = 32 / B) on both sides. Then prints a markdown table
(and writes it with --out): tokens/s, MFU, peak memory, accrue / eager, the
targets (accrue >= 1.3x eager tokens/s; accrue's peak memory <= eager's, each
met/MISSED), and accrue against the llm.c figures on one H200 (LLMC_H200) with
PyTorch eager's reference figures beside them (TORCH_EAGER_H200).

MFU is computed here for both sides with one formula (torch_gpt2.py's
flops_per_token: 6 N + 12 L C T per token) against the GPU's dense bf16 peak
(torch_gpt2.py's table, or --peak-tflops); accrue's own MFU, when its JSON has
one, is kept in the --json rows.

Then the time breakdown (--skip-ncu to leave it out): accrue at (32,1) and
(1,32) (--ncu-points) under Nsight Compute,

  ncu --profile-from-start off --clock-control none --cache-control none
      --metrics gpu__time_duration.sum --csv --print-units base
      accrue_train_gpt2 ... --bench-warmup 1 --bench-windows 1

every kernel's duration (kernels run serialized under ncu, so the sum is the
GPU time of the work, not the window's wall time). The trainer brackets its
timed windows with cudaProfilerStart/Stop (Note [Profiled span]), so ncu
records the one timed window and nothing of the set-up or warm-up (checked:
the window ends at the close's fused_optimizer_kernel), and its kernels are
summed by class (CLASSES: GEMM, attention,
layernorm, classifier, window close, elementwise, other) and printed as
percentages, with the largest kernels of "other".
"""
import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_gpt2  # noqa: E402  (the model arithmetic only: it imports torch in main())

GLOBAL_SEQUENCES = 32
SEQ_LEN = 1024
DEFAULT_POINTS = [(32, 1), (16, 2), (8, 4), (4, 8), (2, 16), (1, 32)]
# tokens/s on one H200 at global batch 32 x 1024, by micro-batch B (K = 32 / B).
LLMC_H200 = {32: 556634, 16: 537702, 8: 496773, 4: 435305, 2: 333190, 1: 228202}
TORCH_EAGER_H200 = {32: 375285, 16: 353327, 8: 319695, 4: 238348, 2: 132023, 1: 53225}
SPEEDUP_TARGET = 1.3

# Kernel classes for the ncu breakdown: the first class any of whose
# substrings is in the lower-cased kernel name wins (order matters: the window
# close and the classifier before GEMM, attention before GEMM and softmax).
# The FP8 casts and their scale rules (kernels/cuda/fp8.cu), a class of their
# own before elementwise, whose "cast" they would match.
FP8_CASTS = ("FP8 casts", ["cast_to_fp8", "cast_blockwise", "cast_transpose", "scale_rule",
                           "calibrate_scale"])
CLASSES = [
    ("window close", ["fused_optimizer", "grad_norm_partials", "window_scalar", "adam",
                      "multi_tensor"]),
    ("classifier", ["classifier", "cross_entropy"]),
    # accrue's composed attention path: softmax_rows, score_grad, backward_rows.
    ("attention", ["cudnn", "sdpa", "flash", "fmha", "attention", "softmax", "score_grad",
                   "backward_rows"]),
    # column_total: LayerNorm's weight and bias gradient totals.
    ("layernorm", ["layer_norm", "layernorm", "column_total"]),
    ("GEMM", ["nvjet", "gemm", "cutlass", "xmma", "cublas", "splitk", "matmul"]),
    FP8_CASTS,
    ("elementwise", ["map_contiguous", "map_strided", "elementwise", "copy", "fill", "scale",
                     "add_scaled", "dropout", "gelu", "cast", "vectorized"]),
]
OTHER = "other"
WINDOW_END_KERNEL = "fused_optimizer_kernel"


def parse_points(text):
    points = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            b, k = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"gpt2_bench: bad point {item!r}: write BxK, e.g. 16x2")
        if b < 1 or k < 1:
            raise SystemExit(f"gpt2_bench: bad point {item!r}: B and K must be >= 1")
        points.append((b, k))
    return points


def default_accrue_bin(name="accrue_train_gpt2"):
    """The first built examples/`name` in the usual build folders."""
    for d in ("build/gpu", "build-gpu", "build/ci", "build"):
        path = os.path.join(d, "examples", name)
        if os.access(path, os.X_OK):
            return path
    return os.path.join("build/gpu/examples", name)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--accrue-bin", default=default_accrue_bin(),
                   help="the accrue_train_gpt2 binary (default: the first built one found)")
    p.add_argument("--points", default=",".join(f"{b}x{k}" for b, k in DEFAULT_POINTS),
                   help="BxK points for accrue and eager PyTorch")
    p.add_argument("--compile-points", default="16x2",
                   help="BxK points for torch.compile ('' for none)")
    p.add_argument("--d48", type=int, default=None, metavar="B",
                   help="also GPT-2 1.5B (d48) at micro-batch B, K = 32 / B, on both sides")
    p.add_argument("--warmup", type=int, default=3, help="untimed windows per run")
    p.add_argument("--windows", type=int, default=10, help="timed windows per run")
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--accrue-args", default="", help="extra options for accrue_train_gpt2")
    p.add_argument("--torch-args", default="", help="extra options for torch_gpt2.py")
    p.add_argument("--skip-torch", action="store_true", help="accrue only")
    p.add_argument("--skip-ncu", action="store_true", help="no Nsight Compute breakdown")
    p.add_argument("--ncu-points", default="32x1,1x32", help="BxK points for the breakdown")
    p.add_argument("--ncu-model", default="d12", choices=["d12", "d48"],
                   help="the GPT-2 size the breakdown profiles")
    p.add_argument("--ncu", default=None, help="the ncu binary (default: from PATH or CUDA)")
    p.add_argument("--ncu-timeout", type=int, default=360, help="seconds per ncu run")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument("--out", help="write the markdown tables to this file")
    p.add_argument("--json", help="write every run's parsed row to this file (a list)")
    p.add_argument("--log-dir", help="keep each run's stdout/stderr here")
    args = p.parse_args()
    args.points = parse_points(args.points)
    args.compile_points = parse_points(args.compile_points)
    args.ncu_points = parse_points(args.ncu_points)
    if args.d48 is not None and (args.d48 < 1 or GLOBAL_SEQUENCES % args.d48 != 0):
        p.error(f"--d48 {args.d48}: the micro-batch must divide {GLOBAL_SEQUENCES}")
    return args


# ---- running ---------------------------------------------------------------------------------

def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        return names[0] if names else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def run_logged(cmd, timeout, log_dir, tag):
    """Runs cmd; returns (exit status or None on timeout, stdout, stderr, seconds)."""
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        status, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        status = None
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    except OSError as e:
        status, out, err = 127, "", str(e)
    seconds = time.time() - start
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, tag + ".log"), "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.write(f"# exit {status} after {seconds:.1f} s\n")
            f.write(f"--- stdout\n{out}\n--- stderr\n{err}\n")
    return status, out, err, seconds


def last_json_line(text):
    """The last line of text that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def pick(d, keys, scale=1.0):
    for key in keys:
        value = d.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) * scale
    return None


def normalize(raw):
    """tokens_per_s, window_ms, peak_mem_gib and the reported mfu from either side's JSON."""
    row = {
        "tokens_per_s": pick(raw, ["tokens_per_s", "tokens_per_s_median", "tokens_per_sec",
                                   "tok_per_s", "tokens_per_second", "throughput"]),
        "window_ms": pick(raw, ["window_ms", "window_ms_median", "median_window_ms",
                                "ms_per_window"]),
        "peak_mem_gib": pick(raw, ["peak_mem_gib", "peak_memory_gib", "peak_gib"]),
        "reported_mfu": pick(raw, ["mfu"]),
    }
    if row["peak_mem_gib"] is None:
        row["peak_mem_gib"] = pick(raw, ["peak_mem_bytes", "peak_memory_bytes", "peak_bytes"],
                                   1.0 / 2**30)
    if row["peak_mem_gib"] is None:
        row["peak_mem_gib"] = pick(raw, ["peak_mem_mib", "peak_memory_mib", "peak_mib"],
                                   1.0 / 1024)
    # A percentage (e.g. 45.3) or a fraction (0.453): kept as a fraction.
    if row["reported_mfu"] is None:
        row["reported_mfu"] = pick(raw, ["mfu_percent", "mfu_pct"], 0.01)
    elif row["reported_mfu"] > 1.0:
        row["reported_mfu"] /= 100.0
    return row


def accrue_cmd(args, model, b, k, warmup, windows):
    cmd = [args.accrue_bin, "--bench", "--synthetic", "--model", model, "--dtype", "bf16",
           "--seq-len", str(SEQ_LEN), "--micro-batch", str(b),
           "--total-batch-tokens", str(b * k * SEQ_LEN),
           "--bench-warmup", str(warmup), "--bench-windows", str(windows)]
    return cmd + args.accrue_args.split()


def torch_cmd(args, model, b, k, compile_):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--model", model,
           "--micro-batch", str(b), "--k", str(k), "--seq-len", str(SEQ_LEN),
           "--warmup", str(args.warmup), "--windows", str(args.windows)]
    if compile_:
        cmd.append("--compile")
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    return cmd + args.torch_args.split()


def run_point(args, impl, model, b, k, gpu):
    """One run; returns its row (always: errors are rows too)."""
    tag = f"{impl}_{model}_{b}x{k}"
    if impl == "accrue":
        cmd = accrue_cmd(args, model, b, k, args.warmup, args.windows)
    else:
        cmd = torch_cmd(args, model, b, k, compile_=(impl == "torch_compile"))
    print(f"[gpt2_bench] {tag}: {' '.join(cmd)}", flush=True)
    status, out, err, seconds = run_logged(cmd, args.timeout, args.log_dir, tag)
    raw = last_json_line(out) or {}
    row = {"impl": impl, "model": model, "micro_batch": b, "K": k, "seconds": round(seconds, 1),
           "exit": status, "raw": raw}
    row.update(normalize(raw))
    if status is None:
        row["error"] = f"timed out after {args.timeout} s"
    elif raw.get("error"):
        row["error"] = str(raw["error"])
    elif "out of memory" in (out + err).lower() and row["tokens_per_s"] is None:
        row["error"] = "out of memory"
    elif status != 0 or row["tokens_per_s"] is None:
        tail = (err.strip() or out.strip()).splitlines()[-1:] or ["no output"]
        row["error"] = f"exit {status}: {tail[0][:200]}"
    if row["tokens_per_s"] is not None and "error" not in row:
        peak = args.peak_tflops or torch_gpt2.peak_tflops(gpu)
        if peak:
            row["mfu"] = (row["tokens_per_s"] * torch_gpt2.flops_per_token(model, SEQ_LEN, 1024)
                          / (peak * 1e12))
        print(f"[gpt2_bench] {tag}: {row['tokens_per_s']:,.0f} tokens/s, "
              f"peak {row['peak_mem_gib'] if row['peak_mem_gib'] is not None else float('nan'):.2f}"
              f" GiB ({seconds:.0f} s)", flush=True)
    else:
        print(f"[gpt2_bench] {tag}: {row.get('error', 'no result')} ({seconds:.0f} s)", flush=True)
    return row


# ---- tables ----------------------------------------------------------------------------------

def fmt_rate(row):
    if row is None:
        return "not run"
    if row.get("error"):
        return "OOM" if "memory" in row["error"] else "failed"
    return f"{row['tokens_per_s']:,.0f}"


def fmt(value, spec, missing="–"):
    return missing if value is None else format(value, spec)


def fmt_mfu(row):
    """This script's MFU, else the run's own (marked), else a dash."""
    if not ok(row):
        return "–"
    if row.get("mfu") is not None:
        return f"{row['mfu']:.1%}"
    if row.get("reported_mfu") is not None:
        return f"{row['reported_mfu']:.1%} (own)"
    return "–"


def ok(row):
    return row is not None and not row.get("error") and row.get("tokens_per_s")


def verdicts(a, t):
    """(ratio text, speed verdict, memory verdict) of accrue row a against PyTorch row t."""
    if not ok(a):
        return "–", "MISSED (accrue failed)", "MISSED (accrue failed)"
    if t is None:
        return "–", "–", "–"
    if not ok(t):
        if t.get("error") == "out of memory":
            return "∞ (PyTorch OOM)", "met (PyTorch OOM)", "met (PyTorch OOM)"
        return "–", "– (PyTorch failed)", "– (PyTorch failed)"
    ratio = a["tokens_per_s"] / t["tokens_per_s"]
    speed = "met" if ratio >= SPEEDUP_TARGET else "MISSED"
    if a["peak_mem_gib"] is None or t["peak_mem_gib"] is None:
        memory = "– (no figure)"
    else:
        memory = "met" if a["peak_mem_gib"] <= t["peak_mem_gib"] else "MISSED"
    return f"{ratio:.2f}x", speed, memory


def main_table(rows, points, model, gpu):
    by = {(r["impl"], r["micro_batch"], r["K"]): r for r in rows if r["model"] == model}
    lines = [
        f"GPT-2 {model}, bf16, global batch {GLOBAL_SEQUENCES} x {SEQ_LEN} tokens, on {gpu}",
        "",
        "| B x K | accrue tok/s | PyTorch eager tok/s | accrue / eager | >= 1.3x | accrue MFU "
        "| eager MFU | accrue peak GiB | eager peak GiB | memory <= eager | llm.c H200 tok/s "
        "| accrue / llm.c | eager H200 ref tok/s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for b, k in points:
        a, t = by.get(("accrue", b, k)), by.get(("torch_eager", b, k))
        ratio, speed, memory = verdicts(a, t)
        llmc = LLMC_H200.get(b) if model == "d12" and b * k == GLOBAL_SEQUENCES else None
        ref = TORCH_EAGER_H200.get(b) if model == "d12" and b * k == GLOBAL_SEQUENCES else None
        vs_llmc = f"{a['tokens_per_s'] / llmc:.2f}" if ok(a) and llmc else "–"
        lines.append(
            f"| {b} x {k} | {fmt_rate(a)} | {fmt_rate(t)} | {ratio} | {speed} "
            f"| {fmt_mfu(a)} | {fmt_mfu(t)} "
            f"| {fmt((a or {}).get('peak_mem_gib'), '.2f')} "
            f"| {fmt((t or {}).get('peak_mem_gib'), '.2f')} | {memory} "
            f"| {fmt(llmc, ',')} | {vs_llmc} | {fmt(ref, ',')} |")
    return lines


def compile_table(rows, points, gpu):
    by = {(r["impl"], r["micro_batch"], r["K"]): r for r in rows if r["model"] == "d12"}
    lines = ["", f"torch.compile (d12, on {gpu})", "",
             "| B x K | accrue tok/s | torch.compile tok/s | accrue / compile | accrue peak GiB "
             "| compile peak GiB |", "|---|---:|---:|---:|---:|---:|"]
    for b, k in points:
        a, c = by.get(("accrue", b, k)), by.get(("torch_compile", b, k))
        ratio = f"{a['tokens_per_s'] / c['tokens_per_s']:.2f}x" if ok(a) and ok(c) else "–"
        lines.append(f"| {b} x {k} | {fmt_rate(a)} | {fmt_rate(c)} | {ratio} "
                     f"| {fmt((a or {}).get('peak_mem_gib'), '.2f')} "
                     f"| {fmt((c or {}).get('peak_mem_gib'), '.2f')} |")
    return lines


def summary_lines(rows, points):
    by = {(r["impl"], r["micro_batch"], r["K"]): r for r in rows if r["model"] == "d12"}
    speed_met = memory_met = counted = 0
    for b, k in points:
        a, t = by.get(("accrue", b, k)), by.get(("torch_eager", b, k))
        if t is None:
            continue
        _, speed, memory = verdicts(a, t)
        counted += 1
        speed_met += speed.startswith("met")
        memory_met += memory.startswith("met")
    if counted == 0:
        return ["targets: no PyTorch runs to compare with"]
    return [f"targets (d12): accrue >= {SPEEDUP_TARGET}x eager tokens/s met at {speed_met} of "
            f"{counted} points; peak memory <= eager met at {memory_met} of {counted}"]


# ---- the ncu breakdown -----------------------------------------------------------------------

def find_ncu(explicit):
    if explicit:
        return explicit
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = os.path.join(root, "bin", "ncu") if root else ""
        if path and os.access(path, os.X_OK):
            return path
    return None


UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
           "second": 1e9, "s": 1e9}


def parse_ncu_csv(text):
    """[(kernel name, duration ns)] in launch order from ncu --csv output (other lines skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"ID"') and "Kernel Name" in line), None)
    if start is None:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    kernels = {}
    for rec in reader:
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            value = float(rec["Metric Value"].replace(",", ""))
            kid = int(rec["ID"])
        except (KeyError, ValueError, AttributeError):
            continue
        unit = (rec.get("Metric Unit") or "nsecond").strip().lower()
        kernels[kid] = (rec.get("Kernel Name", "?"), value * UNIT_NS.get(unit, 1.0))
    return [kernels[i] for i in sorted(kernels)]


# ncu records only the timed windows (the trainers' cudaProfilerStart/Stop).
NCU_TIMED_ONLY = ["--profile-from-start", "off"]


def last_window(kernels, timed_only=False):
    """The kernels of the last complete window, and a note on how it was found.

    timed_only: ncu ran with NCU_TIMED_ONLY over one timed window, so every
    kernel profiled is that window's (the close's report kernels follow its
    optimizer kernel)."""
    ends = [i for i, (name, _) in enumerate(kernels) if WINDOW_END_KERNEL in name]
    if timed_only and len(ends) == 1:
        return kernels, "the timed window alone: ncu --profile-from-start off"
    if len(ends) >= 2:
        return kernels[ends[-2] + 1:ends[-1] + 1], f"the last of {len(ends)} windows"
    if len(ends) == 1:
        return kernels[:ends[0] + 1], "one window found: set-up kernels included"
    return kernels, f"no {WINDOW_END_KERNEL} seen: every kernel profiled"


def classify(name, classes=None):
    """The first of `classes` (default CLASSES) any of whose substrings is in
    the lower-cased kernel name, or OTHER: the one classifier of the benches'
    kernel breakdowns (llama_bench's ncu table, kernel_trace's categories)."""
    lower = name.lower()
    for cls, keys in CLASSES if classes is None else classes:
        if any(key in lower for key in keys):
            return cls
    return OTHER


def short_name(name):
    """A kernel's name without its argument list and return type, for the tables."""
    base = name.split("(")[0].strip()
    if base.startswith("void "):
        base = base[5:]
    return base[:90]


def breakdown_table(kernels, model, b, k, note):
    total = sum(ns for _, ns in kernels)
    by_class = {}
    for name, ns in kernels:
        cls = classify(name)
        count, time_ns = by_class.get(cls, (0, 0.0))
        by_class[cls] = (count + 1, time_ns + ns)
    order = [c for c, _ in CLASSES] + [OTHER]
    lines = ["", f"accrue {model} at {b} x {k}: kernel time by class over one window ({note}; "
                 f"{len(kernels)} kernels, {total / 1e6:.2f} ms of GPU time under ncu)", "",
             "| class | kernels | ms | share |", "|---|---:|---:|---:|"]
    for cls in order:
        count, time_ns = by_class.get(cls, (0, 0.0))
        share = time_ns / total if total else 0.0
        lines.append(f"| {cls} | {count} | {time_ns / 1e6:.2f} | {share:.1%} |")
    others = {}
    for name, ns in kernels:
        if classify(name) == OTHER:
            key = short_name(name)
            others[key] = others.get(key, 0.0) + ns
    if others:
        top = sorted(others.items(), key=lambda kv: -kv[1])[:8]
        lines.append("")
        lines.append("largest kernels in 'other': " + "; ".join(
            f"{n} {ns / 1e6:.2f} ms" for n, ns in top))
    return lines


def ncu_breakdown(args, b, k):
    ncu = find_ncu(args.ncu)
    if ncu is None:
        return ["", f"ncu breakdown at {b} x {k}: ncu not found (Nsight Compute)"]
    cmd = [ncu] + NCU_TIMED_ONLY + ["--clock-control", "none", "--cache-control", "none",
                                    "--metrics", "gpu__time_duration.sum", "--csv",
                                    "--print-units", "base"]
    # Only the timed window is profiled: the warm-up window runs at speed.
    cmd += accrue_cmd(args, args.ncu_model, b, k, warmup=1, windows=1)
    tag = f"ncu_accrue_{args.ncu_model}_{b}x{k}"
    print(f"[gpt2_bench] {tag}: {' '.join(cmd)}", flush=True)
    status, out, err, seconds = run_logged(cmd, args.ncu_timeout, args.log_dir, tag)
    kernels = parse_ncu_csv(out)
    if not kernels:
        reason = "timed out" if status is None else f"exit {status}"
        tail = (err.strip() or out.strip()).splitlines()[-3:]
        return ["", f"ncu breakdown at {b} x {k}: no kernel durations ({reason}, "
                    f"{seconds:.0f} s): " + " / ".join(t[:200] for t in tail)]
    window, note = last_window(kernels, timed_only=True)
    print(f"[gpt2_bench] {tag}: {len(kernels)} kernels profiled in {seconds:.0f} s", flush=True)
    return breakdown_table(window, args.ncu_model, b, k, note)


# ---- main ------------------------------------------------------------------------------------

def main():
    args = parse_args()
    gpu = gpu_name()
    if not os.access(args.accrue_bin, os.X_OK):
        print(f"[gpt2_bench] warning: {args.accrue_bin} is not an executable: the accrue runs "
              "will fail (build accrue_train_gpt2, or pass --accrue-bin)", flush=True)
    rows = []
    for b, k in args.points:
        rows.append(run_point(args, "accrue", "d12", b, k, gpu))
        if not args.skip_torch:
            rows.append(run_point(args, "torch_eager", "d12", b, k, gpu))
    if not args.skip_torch:
        for b, k in args.compile_points:
            if not any(r["impl"] == "accrue" and (r["micro_batch"], r["K"]) == (b, k)
                       for r in rows):
                rows.append(run_point(args, "accrue", "d12", b, k, gpu))
            rows.append(run_point(args, "torch_compile", "d12", b, k, gpu))
    if args.d48 is not None:
        b, k = args.d48, GLOBAL_SEQUENCES // args.d48
        rows.append(run_point(args, "accrue", "d48", b, k, gpu))
        if not args.skip_torch:
            rows.append(run_point(args, "torch_eager", "d48", b, k, gpu))

    table = main_table(rows, args.points, "d12", gpu)
    if not args.skip_torch and args.compile_points:
        table += compile_table(rows, args.compile_points, gpu)
    if args.d48 is not None:
        table += [""] + main_table(rows, [(args.d48, GLOBAL_SEQUENCES // args.d48)], "d48", gpu)
    refs_gpu = "" if "H200" in gpu else (" The llm.c and eager reference figures are from an "
                                          "H200; this GPU is not one.")
    table += ["", "accrue / eager and the targets compare runs on this GPU; llm.c H200 and eager "
                  "H200 ref are fixed reference figures." + refs_gpu]
    table += [""] + summary_lines(rows, args.points)
    if not args.skip_ncu:
        for b, k in args.ncu_points:
            table += ncu_breakdown(args, b, k)

    text = "\n".join(table)
    print("\n" + text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    # Failing runs are reported in the table; the exit status says whether accrue ran at all.
    accrue_rows = [r for r in rows if r["impl"] == "accrue"]
    return 0 if accrue_rows and all(ok(r) for r in accrue_rows) else 1


if __name__ == "__main__":
    sys.exit(main())

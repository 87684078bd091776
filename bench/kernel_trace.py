#!/usr/bin/env python3
"""Where a window's device time goes: every kernel of a few windows of
python/examples/train_gpt2.py, traced through CUPTI (torch.profiler, in the
same process as the accrue module), for each variant side by side.

    python3 bench/kernel_trace.py --variants 'in place=;under=--close-under-forward' \\
        --windows 4 --warmup 4 -- --micro-batch 1 --accum 32 --cuda-graphs

Each variant runs in its own process: train_gpt2.py with the arguments after
`--` and the variant's own, traced over the windows after --warmup. The table
gives, per window: the span on the device (first operation's start to last
one's end over the traced windows, divided by their count), the time some
kernel, memset or copy ran (the union over streams), the idle rest, the time
two streams ran at once (the close under the forward's side stream beside the
forward, say), the close's exposed time (its kernels with nothing beside them),
each stream's busy time, the kernels' time by category (GEMM,
attention, norms, column sums, the close, FP8 casts, ...: `category`), the
memsets and copies (cuDNN's and cuBLASLt's own among them), the pairs of
operations the idle gaps of 2-100 us lie between (a graph waits 2-5 us after
a memset node), and the kernels whose time per window differs most from the
first variant's.
nsys is not on the GPU machine; CUPTI comes with torch. With --out DIR, each
variant's Chrome trace and a summary JSON are written there.

Where torch does not import, the script says so and exits 2 (the trace needs
it); `summarize` reads a Chrome trace with no torch at all.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bench import classify as first_class  # noqa: E402  (imports no torch)
TRAIN_GPT2 = os.path.join(HERE, "..", "python", "examples", "train_gpt2.py")


def union_length(intervals):
    """Total length covered by [start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


# Idle gaps on the device by length in microseconds: [low, high).
GAP_BUCKETS = ("<2us", "2-10us", "10-100us", "100us-1ms", ">=1ms")
_GAP_LIMITS = {"<2us": (0, 2), "2-10us": (2, 10), "10-100us": (10, 100),
               "100us-1ms": (100, 1000), ">=1ms": (1000, float("inf"))}


def in_bucket(us, bucket):
    low, high = _GAP_LIMITS[bucket]
    return low <= us < high


def idle_gaps(ops, spans):
    """(length us, operation before, operation after) for each time no
    operation (kernel, memset or copy) ran, between the first one's start and
    the last one's end."""
    gaps, end, last = [], None, None
    for (s, e), k in sorted(zip(spans, ops), key=lambda x: x[0]):
        if end is not None and s > end:
            gaps.append((s - end, last["name"][:60], k["name"][:60]))
        if end is None or e > end:
            end, last = e, k
    return gaps


# Kernel categories by name, the first that matches: a window's time by kind of
# work (the GEMM share against attention, the norms, the column sums...), what
# a small micro-batch loses where. cuDNN's attention kernels carry "sm90" in
# their names too, so attention is matched before the GEMMs (its backward's
# dQ GEMM, `cudnn::fusion::matmul_dq`, and its dO . O row sums included); the
# close's grad_norm_partials before the column sums' "partial".
CATEGORIES = (
    ("attention", ("sdpa", "flash", "fmha", "attention", "softmax", "score_grad", "rope",
                   "matmul_dq", "dot_do_o")),
    ("gemm", ("nvjet", "gemm", "xmma", "cutlass", "gemv", "cublas")),
    ("norm", ("layer_norm", "rms_norm", "normalize", "statistics")),
    ("close", ("fused_optimizer", "grad_norm", "scalar_step", "store_hyper", "slot_steps",
               "scale_rule", "loss_total", "store_flags", "first_fault")),
    ("column sums", ("sum_columns", "column_", "bias_grad", "chunk_sums", "tile_sums",
                     "slot_sums", "cluster_kernel", "reduce_rows", "group_sum", "partial")),
    ("fp8 casts", ("fp8", "amax", "cast_blockwise", "cast_transpose", "delayed_update",
                   "calibrate_scale")),
    ("classifier", ("classifier", "cross_entropy")),
    ("embedding", ("embedding", "scatter", "gather", "sort", "order_keys", "take_sorted")),
    ("elementwise", ("map_", "copy", "fill", "add_scaled", "scale_", "gelu", "swiglu",
                     "dropout", "arange", "zero_padding", "elementwise", "vectorized")),
)


def category(name):
    """The category of a kernel's (demangled) name; "other" when none matches."""
    return first_class(name, CATEGORIES)


# Device operations besides kernels, as CUPTI names their trace categories.
COPIES = ("gpu_memset", "gpu_memcpy")


def span_of(event):
    """[start, end) of a trace event in microseconds."""
    return float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))


def gap_pairs(gaps, windows, top=8):
    """The pairs of operations the gaps of 2-100 us lie between, most idle
    time first: count and ms per window, and the mean gap."""
    pairs = collections.defaultdict(list)
    for us, after, before in gaps:
        if 2 <= us < 100:
            pairs[(after, before)].append(us)
    ranked = sorted(pairs.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"after": a, "before": b, "count": len(v) / windows, "us_each": sum(v) / len(v),
             "ms": sum(v) * 1e-3 / windows} for (a, b), v in ranked]


def summarize(trace, windows):
    """Per-window figures (ms) from a Chrome trace's kernel, memset and copy events."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        raise ValueError("the trace holds no kernel events (was CUPTI tracing on?)")
    copies = [e for e in events if e.get("cat") in COPIES]
    spans = [span_of(e) for e in kernels]
    device_ops, device_spans = kernels + copies, spans + [span_of(e) for e in copies]
    start, end = min(s for s, _ in device_spans), max(e for _, e in device_spans)
    runtime = collections.Counter()
    for e in trace.get("traceEvents", []):
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X":
            runtime[e["name"]] += float(e.get("dur", 0))
    per_stream = collections.defaultdict(list)
    per_name = collections.Counter()
    counts = collections.Counter()
    for e, span in zip(kernels, spans):
        per_stream[str(e.get("args", {}).get("stream", "?"))].append(span)
        per_name[e["name"]] += span[1] - span[0]
        counts[e["name"]] += 1
    ms = 1e-3 / windows
    per_category = collections.Counter()
    for name, us in per_name.items():
        per_category[category(name)] += us
    for e in copies:
        per_stream[str(e.get("args", {}).get("stream", "?"))].append(span_of(e))
    busy = union_length(device_spans)
    # The close exposed: the time its kernels (category "close") ran with no
    # other device work beside them; all of it in place, and under the forward
    # (--close-under-forward) what the forward's kernels do not cover.
    others = [s for e, s in zip(kernels, spans) if category(e["name"]) != "close"]
    close_exposed = busy - union_length(others + [span_of(e) for e in copies])
    gaps = idle_gaps(device_ops, device_spans)
    streams = {k: union_length(v) for k, v in sorted(per_stream.items())}
    copy_counts = collections.Counter(e["cat"] for e in copies)
    copy_us = collections.Counter()
    for e in copies:
        copy_us[e["cat"]] += float(e.get("dur", 0))
    return {
        "windows": windows,
        "span_ms": (end - start) * ms,
        "busy_ms": busy * ms,
        "idle_ms": (end - start - busy) * ms,
        # Time two streams ran kernels at once (the busy streams' sum over the union).
        "overlap_ms": (sum(streams.values()) - busy) * ms,
        "close_exposed_ms": close_exposed * ms,
        "kernels_per_window": len(kernels) / windows,
        "streams_ms": {k: v * ms for k, v in streams.items()},
        "kernels_ms": {k: v * ms for k, v in per_name.most_common()},
        # Kernel time (summed over streams) by category.
        "categories_ms": {k: v * ms for k, v in per_category.most_common()},
        "kernel_counts": {k: counts[k] / windows for k in per_name},
        # Memsets and copies: count and ms per window.
        "copies": {c: {"count": copy_counts[c] / windows, "ms": copy_us[c] * ms} for c in COPIES},
        # Where the idle time lies: how many gaps of each size a window has, and
        # their time (many small gaps point at the launches, a few large ones at
        # a wait); the largest few, between which kernels.
        "gap_counts": {b: sum(1 for g in gaps if in_bucket(g[0], b)) / windows
                       for b in GAP_BUCKETS},
        "gap_ms": {b: sum(g[0] for g in gaps if in_bucket(g[0], b)) * ms for b in GAP_BUCKETS},
        "largest_gaps": [{"us": g[0], "after": g[1], "before": g[2]}
                         for g in sorted(gaps, reverse=True)[:5]],
        "gap_pairs": gap_pairs(gaps, windows),
        # The host's CUDA API time (a synchronization shows here), where traced.
        "runtime_ms": {k: v * ms for k, v in runtime.most_common(8)},
    }


def synchronizes_after(closed, warmup, windows):
    """Whether the tracer waits for the device after the closed-th window: only
    where the traced windows begin and end, so that they hold the device's work
    of those windows. A wait after every window would also end each window on
    the device, and hide what runs across two windows (the close under the
    forward's steps beside the next forward)."""
    return closed in (warmup, warmup + windows)


def trace_one(train_args, windows, warmup, out_path):
    """Runs train_gpt2.py's main in this process under torch.profiler."""
    import importlib.util

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.cuda.init()  # CUPTI attaches to the context accrue's module then shares
    spec = importlib.util.spec_from_file_location("train_gpt2", TRAIN_GPT2)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = []

    def write(p):  # when the active windows are done (the schedule's documented hook)
        p.export_chrome_trace(out_path)
        written.append(out_path)

    with profile(activities=[ProfilerActivity.CUDA], on_trace_ready=write,
                 schedule=schedule(wait=0, warmup=warmup, active=windows, repeat=1)) as prof:
        closed = [0]

        def on_window(_):
            closed[0] += 1
            if synchronizes_after(closed[0], warmup, windows):
                torch.cuda.synchronize()
            prof.step()
        module.main(train_args + ["--windows", str(warmup + windows), "--warmup", "0",
                                  "--log-every", str(warmup + windows)], on_window=on_window)
    if not written:
        raise RuntimeError(f"kernel_trace: no trace was written to {out_path}")


def table(names, results, top):
    lines = ["| per window, ms | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for key in ("span_ms", "busy_ms", "idle_ms", "overlap_ms", "close_exposed_ms",
                "kernels_per_window"):
        lines.append(f"| {key} | " + " | ".join(f"{r[key]:.3f}" for r in results) + " |")
    for c in COPIES:
        lines.append(f"| {c}: count, ms | " + " | ".join(
            f"{r['copies'][c]['count']:.1f}, {r['copies'][c]['ms']:.3f}" for r in results) + " |")
    for b in GAP_BUCKETS:
        lines.append(f"| gaps {b}: count, ms | " + " | ".join(
            f"{r['gap_counts'][b]:.1f}, {r['gap_ms'][b]:.3f}" for r in results) + " |")
    for call in sorted({c for r in results for c in r["runtime_ms"]}):
        lines.append(f"| host `{call[:40]}` | " +
                     " | ".join(f"{r['runtime_ms'].get(call, 0):.3f}" for r in results) + " |")
    labels = [c for c, _ in CATEGORIES] + ["other"]
    for c in labels:
        if any(c in r["categories_ms"] for r in results):
            lines.append(f"| kernels: {c} | " + " | ".join(
                f"{r['categories_ms'].get(c, 0):.3f}" for r in results) + " |")
    streams = sorted({s for r in results for s in r["streams_ms"]})
    for s in streams:
        lines.append(f"| stream {s} busy | " +
                     " | ".join(f"{r['streams_ms'].get(s, 0):.3f}" for r in results) + " |")
    base = results[0]["kernels_ms"]
    every = {k for r in results for k in r["kernels_ms"]}
    moved = sorted(every, key=lambda k: -max(abs(r["kernels_ms"].get(k, 0) - base.get(k, 0))
                                            for r in results))[:top]
    for k in moved:
        cells = []
        for r in results:
            cells.append(f"{r['kernels_ms'].get(k, 0):.3f} ({r['kernel_counts'].get(k, 0):.1f}x)")
        lines.append(f"| `{k[:70]}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="in place=;under=--close-under-forward",
                   help="NAME=ARGS;NAME=ARGS...: each variant's own train_gpt2.py arguments")
    p.add_argument("--windows", type=int, default=4, help="traced windows")
    p.add_argument("--warmup", type=int, default=4, help="untraced windows first")
    p.add_argument("--top", type=int, default=15, help="kernels listed, most moved first")
    p.add_argument("--out", default=None, help="a folder for the traces and summary.json")
    p.add_argument("--one", nargs=2, metavar=("TRACE", "NAME"), help=argparse.SUPPRESS)
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="after --: train_gpt2.py's arguments, shared by every variant")
    args = p.parse_args(argv)
    if args.windows < 1 or args.warmup < 1:
        p.error(f"--windows and --warmup must be at least 1, got {args.windows} and {args.warmup}")
    variants = []
    for item in args.variants.split(";"):
        name, sep, extra = item.partition("=")
        if not sep or not name.strip():
            p.error(f"--variants takes NAME=ARGS items separated by ';', got '{item}'")
        variants.append((name.strip(), extra.split()))
    args.variants = variants
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    for flag in ("--windows", "--warmup", "--log-every"):
        if flag in args.train_args:
            p.error(f"{flag} is the tracer's to set; give --windows/--warmup before --")
    return args


def main(argv=None):
    args = parse(argv)
    if args.one:  # a child: trace one variant
        trace_one(args.train_args, args.windows, args.warmup, args.one[0])
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("kernel_trace: torch does not import here; the trace needs torch.profiler",
              file=sys.stderr)
        return 2
    out = args.out or os.path.join(os.getcwd(), "kernel_trace")
    os.makedirs(out, exist_ok=True)
    names, results = [], []
    for name, extra in args.variants:
        path = os.path.join(out, "".join(c if c.isalnum() else "_" for c in name) + ".json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", path, name,
               "--windows", str(args.windows), "--warmup", str(args.warmup), "--",
               *args.train_args, *extra]
        print("kernel_trace:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(path) as f:
            results.append(summarize(json.load(f), args.windows))
        names.append(name)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(dict(zip(names, results)), f, indent=1)
    print(table(names, results, args.top))
    for name, r in zip(names, results):
        print(f"{name}: largest gaps (us, after, before):")
        for g in r["largest_gaps"]:
            print(f"  {g['us']:.1f}  {g['after']}  ->  {g['before']}")
        print(f"{name}: where the gaps of 2-100 us lie (per window: count x mean us = ms):")
        for g in r["gap_pairs"]:
            print(f"  {g['count']:.1f} x {g['us_each']:.2f} us = {g['ms']:.3f} ms  "
                  f"{g['after']}  ->  {g['before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

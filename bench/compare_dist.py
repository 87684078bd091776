#!/usr/bin/env python3
"""Markdown tables of the data-parallel benchmarks: accrue_bench_dist and torch_ddp.py.

    python3 bench/compare_dist.py --accrue accrue_dist.json --torch torch_ddp.json \
        [--markdown tables.md]

Each file holds one run object ({"tool", "mode", "world_size", ..., "rows": [...]})
as accrue_bench_dist --json and torch_ddp.py --json write it, or a list of them
(tools/multi_gpu_check.sh merges its runs that way); any number of files per side.

Tables (each row says PASS or MISS against the issue's targets):
  1. bucketed all-reduce of the GPT-2 124M gradient arena per bucket size
     (accrue --mode allreduce): bucketed busbw >= 90% of one raw ncclAllReduce of
     the same bytes; beside it the raw busbw at the bucket's own size.
  2. scaling at a fixed micro-batch: 2-GPU / 1-GPU throughput (target >= 1.9 at
     K >= 4) and accrue / PyTorch window time per K and world size (below 1:
     accrue is faster).
  3. the literature-style table at a fixed global batch: micro-batch x K x
     all-reduces per window x throughput x peak memory, on 1 and 2 GPUs, with
     PyTorch beside it.
"""
import argparse
import json
import sys

BUSBW_TARGET = 0.90  # bucketed busbw / raw busbw of the same bytes
SCALING_TARGET = 1.9  # 2-GPU / 1-GPU throughput ...
SCALING_MIN_K = 4  # ... at K >= this
DEFAULT_BUCKET_MB = 25  # BucketPlanOptions' default: the all-reduce verdict of the summary


def load_runs(paths):
    runs = []
    for path in paths or []:
        with open(path) as f:
            data = json.load(f)
        runs.extend(data if isinstance(data, list) else [data])
    return runs


def fmt(v, spec=".2f", none="—"):
    return none if v is None else format(v, spec)


def verdict(ok):
    return "—" if ok is None else ("PASS" if ok else "MISS")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def allreduce_section(runs, verdicts, notes):
    out = []
    for run in runs:
        rows = []
        for r in run["rows"]:
            ratio = r.get("bucketed_over_raw")
            ok = None if ratio is None else ratio >= BUSBW_TARGET
            # The summary's verdict is the default bucket size's; the table shows every size.
            if r["bucket_mb"] == DEFAULT_BUCKET_MB:
                verdicts.append((f"all-reduce with {DEFAULT_BUCKET_MB} MiB buckets (the default): "
                                 f"busbw {fmt(ratio, '.1%')} of raw (>= {BUSBW_TARGET:.0%})", ok))
            elif ok is False:
                notes.append(f"all-reduce with {r['bucket_mb']:g} MiB buckets: busbw "
                             f"{fmt(ratio, '.1%')} of raw (below {BUSBW_TARGET:.0%})")
            rows.append([
                f"{r['bucket_mb']:g} MiB", f"{r['buckets']:g}", fmt(r["bucketed_ms"], ".3f"),
                fmt(r["bucketed_busbw_GBps"], ".1f"), fmt(r["raw_total_ms"], ".3f"),
                fmt(r["raw_total_busbw_GBps"], ".1f"), fmt(ratio, ".1%"),
                fmt(r.get("enqueue_us_per_bucket"), ".1f"), fmt(r["raw_bucket_ms"], ".3f"),
                fmt(r["raw_bucket_busbw_GBps"], ".1f"), verdict(ok)])
        first = run["rows"][0] if run["rows"] else {}
        out.append(
            f"### Bucketed all-reduce of the GPT-2 124M fp32 gradient arena, "
            f"{run['world_size']} ranks, {run.get('device', '?')}\n\n"
            f"{fmt(first.get('total_bytes', 0) / 1e6, '.1f')} MB per all-reduce; accrue's "
            f"BucketPlan cut, every bucket view all-reduced in plan order through "
            f"NcclCommunicator (as the Reducer does) vs ONE raw ncclAllReduce of the same bytes "
            f"(accrue's communicator, one call: {fmt(first.get('whole_ms'), '.3f')} ms). "
            f"busbw = algbw x 2(n-1)/n. Median of {run.get('repeats', '?')} repeats, min over "
            f"ranks (Note [Collective timing]). Target: bucketed busbw >= "
            f"{BUSBW_TARGET:.0%} of raw.\n\n" +
            table(["bucket", "buckets", "bucketed ms", "busbw GB/s", "raw same bytes ms",
                   "raw busbw GB/s", "bucketed / raw", "enqueue µs/bucket",
                   "raw at bucket size ms", "raw busbw at bucket size GB/s", "≥ 90%"], rows))
    return out


def index_rows(runs):
    """{(table, variant, world, K): row} over the scaling runs."""
    rows = {}
    for run in runs:
        if run.get("mode") != "scaling":
            continue
        for r in run["rows"]:
            rows[(r["table"], r["variant"], int(r["world_size"]), int(r["K"]))] = r
    return rows


def single_gpu(rows, table, k):
    """The world-size-1 row of (table, K): there is one, whatever its variant is called."""
    for (t, _, w, kk), r in rows.items():
        if (t, w, kk) == (table, 1, k):
            return r
    return None


def model_line(runs):
    for run in runs:
        if run.get("mode") == "scaling":
            return (f"MLP of {run['depth']} Linear+GELU layers of width {run['width']} "
                    f"({run['in']} -> {run['classes']} classes), "
                    f"{run['params'] / 1e6:.1f}M parameters, f32 master weights, "
                    f"{run['compute_dtype']} compute, AdamW, item-count normalization, clipping "
                    f"at 1.0; median window time over {run['windows']} windows after "
                    f"{run['warmup']} warm-up, max over ranks; {run.get('device', '?')}")
    return ""


def same_shape(a, t):
    """t when it ran the same micro-batch and K as a (else it is not comparable)."""
    if a is None or t is None:
        return t
    return t if (a["micro_batch"], a["K"]) == (t["micro_batch"], t["K"]) else None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def get(row, key):
    return None if row is None else row.get(key)


def scaling_section(accrue, torch, verdicts, description):
    # One row per (variant, K) run on several GPUs; K run on one GPU only still gets a row.
    keys = {(v, k) for (t, v, w, k) in accrue if t == "fixed_micro" and w > 1}
    multi = {k for _, k in keys}
    keys |= {(v, k) for (t, v, w, k) in accrue if t == "fixed_micro" and k not in multi}
    keys = sorted(keys, key=lambda vk: (vk[0] != "ddp", vk[0], vk[1]))
    if not keys:
        return []
    rows = []
    for variant, k in keys:
        a1, a2 = single_gpu(accrue, "fixed_micro", k), accrue.get(("fixed_micro", variant, 2, k))
        t1 = same_shape(a1, single_gpu(torch, "fixed_micro", k))
        # A bf16-transport variant is set beside DDP's bf16_compress_hook when that ran.
        twin = "ddp_bf16" if "_bf16" in variant and ("fixed_micro", "ddp_bf16", 2, k) in torch \
            else "ddp"
        t2 = same_shape(a2, torch.get(("fixed_micro", twin, 2, k)))
        speedup = ratio(get(a2, "items_per_s"), get(a1, "items_per_s"))
        ok = None
        if k >= SCALING_MIN_K and speedup is not None:
            ok = speedup >= SCALING_TARGET
            verdicts.append((f"scaling {variant} K={k}: 2-GPU / 1-GPU throughput "
                             f"{speedup:.2f}x (>= {SCALING_TARGET})", ok))
        rows.append([
            variant, k, get(a1 or a2, "micro_batch"),
            fmt(get(a1, "items_per_s"), ",.0f"), fmt(get(a2, "items_per_s"), ",.0f"),
            fmt(speedup, ".2f"), verdict(ok) if k >= SCALING_MIN_K else "—",
            fmt(get(a2, "allreduces_per_window"), ".1f"),
            f"{fmt(get(a1, 'peak_mem_MB'), ',.0f')} / {fmt(get(a2, 'peak_mem_MB'), ',.0f')}",
            fmt(get(t1, "items_per_s"), ",.0f"), fmt(get(t2, "items_per_s"), ",.0f"),
            fmt(ratio(get(t2, "items_per_s"), get(t1, "items_per_s")), ".2f"),
            fmt(ratio(get(a1, "window_ms"), get(t1, "window_ms")), ".2f"),
            fmt(ratio(get(a2, "window_ms"), get(t2, "window_ms")), ".2f")])
    return [
        "### Data-parallel scaling at a fixed micro-batch\n\n" + description +
        f". Target: 2 GPUs >= {SCALING_TARGET}x one GPU's throughput at K >= {SCALING_MIN_K}. "
        "accrue / PyTorch = window time ratio (below 1: accrue is faster). Peak memory is per "
        "rank.\n\n" +
        table(["variant", "K", "micro-batch", "accrue 1 GPU items/s", "accrue 2 GPU items/s",
               "2 / 1", f"≥ {SCALING_TARGET}x", "collectives / window (2 GPU)",
               "peak MB 1 / 2 GPU", "PyTorch 1 GPU items/s", "PyTorch 2 GPU items/s",
               "PyTorch 2 / 1", "accrue / PyTorch 1 GPU", "accrue / PyTorch 2 GPU"], rows)]


def fixed_global_section(accrue, torch):
    keys = sorted({(w, v, k) for (t, v, w, k) in accrue if t == "fixed_global"},
                  key=lambda wvk: (wvk[0], wvk[1] != "ddp", wvk[1], wvk[2]))
    if not keys:
        return []
    rows = []
    global_batch = None
    for world, variant, k in keys:
        a = accrue[("fixed_global", variant, world, k)]
        t = same_shape(a, torch.get(("fixed_global", "ddp", world, k)))
        global_batch = a["items_per_window"]
        rows.append([
            world, variant, a["micro_batch"], k, fmt(a["allreduces_per_window"], ".1f"),
            fmt(a["items_per_s"], ",.0f"), fmt(a["peak_mem_MB"], ",.0f"),
            fmt(get(t, "allreduces_per_window"), ".1f"), fmt(get(t, "items_per_s"), ",.0f"),
            fmt(get(t, "peak_mem_MB"), ",.0f"),
            fmt(ratio(a["window_ms"], get(t, "window_ms")), ".2f")])
    return [
        f"### Fixed global batch: {global_batch:,.0f} items per window\n\n"
        "micro-batch = global batch / (K x GPUs). Collectives per window: accrue counts every "
        "collective its Reducer issues (ddp: an all-reduce per bucket and one for the item "
        "count; zero1: a reduce-scatter and an all-gather per bucket, the item count, the norm "
        "partials), PyTorch DDP's all-reduces (one per bucket). Peak memory is per rank.\n\n" +
        table(["GPUs", "variant", "micro-batch", "K", "accrue collectives / window",
               "accrue items/s", "accrue peak MB", "PyTorch all-reduces / window",
               "PyTorch items/s", "PyTorch peak MB", "accrue / PyTorch time"], rows)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accrue", nargs="*", default=[], help="accrue_bench_dist JSON files")
    parser.add_argument("--torch", nargs="*", default=[], help="torch_ddp.py JSON files")
    parser.add_argument("--markdown", help="also write the tables here")
    args = parser.parse_args()

    accrue_runs = load_runs(args.accrue)
    torch_runs = load_runs(args.torch)
    if not accrue_runs:
        print("compare_dist: no accrue results", file=sys.stderr)
        return 1
    verdicts, notes = [], []
    sections = allreduce_section([r for r in accrue_runs if r.get("mode") == "allreduce"],
                                 verdicts, notes)
    accrue_rows, torch_rows = index_rows(accrue_runs), index_rows(torch_runs)
    sections += scaling_section(accrue_rows, torch_rows, verdicts, model_line(accrue_runs))
    sections += fixed_global_section(accrue_rows, torch_rows)

    # Different models on the two sides would make every ratio meaningless: say so.
    sizes = {(r["tool"], r["params"]) for r in accrue_runs + torch_runs if r.get("mode") == "scaling"}
    if len({p for _, p in sizes}) > 1:
        notes.append("the runs trained models of different sizes: " +
                     ", ".join(f"{tool} {p:,}" for tool, p in sorted(sizes)))

    passed = sum(1 for _, ok in verdicts if ok)
    missed = [text for text, ok in verdicts if ok is False]
    summary = ([f"targets: {passed} PASS, {len(missed)} MISS"] + [f"MISS: {m}" for m in missed] +
               [f"note: {n}" for n in notes])
    text = "\n\n".join(sections) + "\n\n" + "\n".join(summary) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

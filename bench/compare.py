#!/usr/bin/env python3
"""Side-by-side table of accrue_bench and torch_bench.py / torch_accumulation.py results.

    python3 bench/compare.py --accrue bench.json \
        --torch torch_bench.json torch_accumulation.json \
        --markdown comparison.md [--results-rows rows.md --command "tools/gpu_check.sh"]

--accrue takes Google Benchmark JSON (--benchmark_out=FILE
--benchmark_out_format=json, or --benchmark_format=json on stdout); with
--benchmark_repetitions the median aggregate is used, else the mean of the
runs. --torch takes the JSON files that the PyTorch scripts write. Rows are
matched by benchmark name. ratio = accrue ms / PyTorch ms (below 1: accrue
is faster). copy frac = accrue's bytes/s over accrue's measured
device-to-device copy bandwidth. floor = the op's bytes (accrue's) at that
bandwidth, except for wgrad/ rows, whose floor is accrue's beta-0 GEMM of the
same shape (the `write` row): accumulating into the slot should cost nothing
more. x floor = accrue ms / floor ms.

After the table: the accumulation targets (window close, its norm pass, the
fused weight-gradient GEMM) with met/MISSED, and the wgrad variants side by side.
"""
import argparse
import json
import re
import statistics
import sys

# Parts Google Benchmark appends to a registered name: "/manual_time",
# "/iterations:3", "/repeats:5", "/threads:1", ...
RUN_SUFFIX = re.compile(r"^(manual_time|real_time|[a-z_]+:[0-9.]+)$")
TIME_UNIT_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def base_name(name):
    """The registered name, which torch_bench.py uses too."""
    parts = name.split("/")
    while len(parts) > 1 and RUN_SUFFIX.match(parts[-1]):
        parts.pop()
    return "/".join(parts)


def load_accrue(paths):
    """Returns (context, {name: row}) from Google Benchmark JSON files."""
    context, runs, medians, errors, order = {}, {}, {}, {}, []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context.update(data.get("context", {}))
        for b in data.get("benchmarks", []):
            name = base_name(b.get("run_name", b["name"]))
            if name not in order:
                order.append(name)
            if b.get("error_occurred"):
                errors[name] = b.get("error_message", "error")
                continue
            row = {
                "ms": b["real_time"] * TIME_UNIT_TO_MS[b.get("time_unit", "ns")],
                "GB/s": b.get("GB/s"),
                "TFLOP/s": b.get("TFLOP/s"),
                "copy_frac": b.get("copy_frac"),
                "bytes": b.get("bytes"),
                "flop": b.get("flop"),
            }
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[name] = row
            else:
                runs.setdefault(name, []).append(row)
    rows = {}
    for name in order:  # the binary's order
        if name in medians:
            rows[name] = medians[name]
        elif name in runs:
            # Without aggregates: the mean of the repetitions, per field.
            samples = runs[name]
            rows[name] = {k: (statistics.mean(s[k] for s in samples)
                              if samples[0][k] is not None else None) for k in samples[0]}
        else:
            rows[name] = {"error": errors[name]}
    return context, rows


def load_torch(paths):
    """Returns (context, {name: row}) from the PyTorch scripts' JSON files."""
    context, rows = {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        ctx = data.get("context", {})
        if context.get("gpu") and ctx.get("gpu") and ctx["gpu"] != context["gpu"]:
            print(f"compare: warning: PyTorch files from {context['gpu']} and {ctx['gpu']}",
                  file=sys.stderr)
        for key, value in ctx.items():
            context.setdefault(key, value)  # the first file's copy bandwidth, say
        for b in data.get("benchmarks", []):
            rows[b["name"]] = b
    return context, rows


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def rate(row):
    if row is None or "error" in row:
        return None
    if row.get("GB/s") is not None:
        return f"{row['GB/s']:.0f} GB/s"
    if row.get("TFLOP/s") is not None:
        return f"{row['TFLOP/s']:.1f} TFLOP/s"
    return None


# wgrad/<dtype>/<layer>_<out>x<in>/T=<tokens>/<variant>: group and variant.
WGRAD_NAME = re.compile(r"^(wgrad/.+/T=[0-9]+)/([a-z0-9_]+)$")


def floor_ms(name, a, t, accrue, copy_bytes_per_s):
    """The op's floor in ms, or None (see the module docstring)."""
    m = WGRAD_NAME.match(name)
    if m:
        write = accrue.get(m.group(1) + "/write")
        return write.get("ms") if write else None
    # accrue's bytes; a PyTorch-only row gives accrue's bytes as floor_bytes.
    nbytes = (a or {}).get("bytes") or (t or {}).get("floor_bytes") or (t or {}).get("bytes")
    return nbytes / copy_bytes_per_s * 1e3 if nbytes and copy_bytes_per_s else None


def build_rows(accrue, torch, copy_bytes_per_s):
    """One dict of numbers per name, in accrue_bench's order, then the PyTorch-only names."""
    names = list(accrue) + [n for n in torch if n not in accrue]
    rows = []
    for name in names:
        a, t = accrue.get(name), torch.get(name)
        a_ms = a.get("ms") if a else None
        t_ms = t.get("ms") if t else None
        floor = floor_ms(name, a, t, accrue, copy_bytes_per_s)
        rows.append({"name": name, "a": a, "t": t, "a_ms": a_ms, "t_ms": t_ms,
                     "ratio": a_ms / t_ms if a_ms and t_ms else None,
                     "floor_ms": floor,
                     "x_floor": a_ms / floor if a_ms and floor else None,
                     "copy_frac": a.get("copy_frac") if a else None})
    return rows


def error_or_ms(row, ms):
    return row["error"][:40] if row and "error" in row else fmt(ms, ".3f")


def build_table(rows):
    """The side-by-side table as lists of strings."""
    return [[r["name"], error_or_ms(r["a"], r["a_ms"]), error_or_ms(r["t"], r["t_ms"]),
             fmt(r["ratio"], ".2f"), rate(r["a"]) or "—", rate(r["t"]) or "—",
             fmt(r["copy_frac"], ".2f"), fmt(r["floor_ms"], ".3f"), fmt(r["x_floor"], ".2f")]
            for r in rows]


HEADER = ["op", "accrue ms", "PyTorch ms", "ratio", "accrue rate", "PyTorch rate",
          "copy frac", "floor ms", "x floor"]


def divide(a, b):
    return a / b if a and b else None


def target_rows(rows):
    """[check, target, measured, verdict] for each accumulation target among the rows."""
    out = []

    def check(what, target, value, ok):
        verdict = "—" if value is None else ("met" if ok(value) else "MISSED")
        out.append([what, target, fmt(value, ".2f"), verdict])

    for r in rows:
        name = r["name"]
        if r["a"] is None:  # a PyTorch-only row: no accrue figure to check
            continue
        if re.match(r"^window_close/.+/close(_bf16copy)?$", name):
            check(f"{name}: accrue / floor", "<= 1.15", r["x_floor"], lambda v: v <= 1.15)
            check(f"{name}: PyTorch / accrue", ">= 2", divide(r["t_ms"], r["a_ms"]),
                  lambda v: v >= 2)
        elif name == "window_close/gpt2_124M/close_skip":
            # Note [Unused parameters]: skip's tables cost at most 2% of the close.
            plain = next((x for x in rows if x["name"] == "window_close/gpt2_124M/close"), None)
            check(f"{name}: skip / plain close", "<= 1.02",
                  divide(r["a_ms"], plain and plain["a_ms"]), lambda v: v <= 1.02)
        elif name == "window_close/gpt2_124M/norm":
            check(f"{name}: copy frac", ">= 0.85", r["copy_frac"], lambda v: v >= 0.85)
        elif name.startswith("wgrad/") and name.endswith("/accumulate"):
            check(f"{name}: beta 1 / beta 0", "<= 1.05", r["x_floor"], lambda v: v <= 1.05)
    return out


TARGET_HEADER = ["check", "target", "measured", "verdict"]

# GEMM parity: every GPT-2 training GEMM within 3% of PyTorch's time.
GEMM_PARITY = 1.03
GEMM_HEADER = ["GPT-2 GEMM", "accrue ms", "PyTorch ms", "accrue / PyTorch", "<= 1.03",
               "PyTorch autograd pattern ms", "accrue TFLOP/s"]
# Convolution parity: ResNet-50's convolutions, forward and backward, within 5% of PyTorch's time.
CONV_PARITY = 1.05
CONV_HEADER = ["ResNet-50 convolution", "accrue ms", "PyTorch ms", "accrue / PyTorch", "<= 1.05",
               "accrue TFLOP/s"]


def parity_rows(rows, prefix, limit, pattern_prefix=None):
    """One row per benchmark named prefix...: the two times, their ratio, the
    verdict against limit and, with pattern_prefix, PyTorch's time under the
    name with that prefix instead (for GEMMs: autograd's autocast pattern)."""
    by_name = {r["name"]: r for r in rows}
    table = []
    for r in rows:
        if not r["name"].startswith(prefix):
            continue
        ratio = divide(r["a_ms"], r["t_ms"])
        verdict = "—" if ratio is None else ("met" if ratio <= limit else "MISSED")
        row = [r["name"][len(prefix):], fmt(r["a_ms"], ".4f"), fmt(r["t_ms"], ".4f"),
               fmt(ratio, ".3f"), verdict]
        if pattern_prefix:
            pattern = by_name.get(r["name"].replace(prefix, pattern_prefix, 1))
            row.append(fmt(pattern and pattern["t_ms"], ".4f"))
        table.append(row + [rate(r["a"]) or "—"])
    met = sum(1 for row in table if row[4] == "met")
    if table:
        table.append([f"within {round((limit - 1) * 100)}%: {met} of {len(table)}"] +
                     [""] * (len(table[0]) - 1))
    return table

# (header, side, variant) of the wgrad table's time columns; side a = accrue, t = PyTorch.
WGRAD_COLUMNS = [
    ("write", "a", "write"),
    ("accumulate", "a", "accumulate"),
    ("f32 tmp+axpy", "a", "unfused_f32_tmp"),
    ("bf16 tmp+cast+axpy", "a", "unfused_bf16_tmp"),
    ("PT acc+=g.t()@x", "t", "accumulate"),
    ("PT acc+=(g.t()@x).float()", "t", "unfused_bf16_tmp"),
    ("PT acc+=mm(out_dtype)", "t", "unfused_f32_tmp"),
    ("PT addmm(out_dtype)", "t", "accumulate_addmm"),
]
WGRAD_HEADER = (["wgrad (ms)"] + [c[0] for c in WGRAD_COLUMNS] +
                ["accumulate/write", "PT acc+=g.t()@x / accumulate", "best PT / accumulate"])


def wgrad_rows(rows):
    """One row per shape and token count: every variant's ms, then the ratios."""
    groups = {}
    for r in rows:
        m = WGRAD_NAME.match(r["name"])
        if m:
            groups.setdefault(m.group(1), {})[m.group(2)] = r
    table = []
    for group, variants in groups.items():
        def ms(side, variant):
            r = variants.get(variant)
            return r[side + "_ms"] if r else None

        times = [ms(side, variant) for _, side, variant in WGRAD_COLUMNS]
        torch_times = [x for (_, side, _), x in zip(WGRAD_COLUMNS, times) if side == "t" and x]
        accumulate = ms("a", "accumulate")
        table.append([group[len("wgrad/"):]] + [fmt(x, ".3f") for x in times] + [
            fmt(divide(accumulate, ms("a", "write")), ".3f"),
            fmt(divide(ms("t", "accumulate"), accumulate), ".2f"),
            fmt(divide(min(torch_times) if torch_times else None, accumulate), ".2f")])
    return table


def render_text(table, header=HEADER):
    widths = [max(len(r[i]) for r in [header] + table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in [header] + table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(table, header=HEADER):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    return "\n".join(lines)


def results_rows(table, gpu, command):
    """Rows in bench/RESULTS.md's format: GPU model | op | accrue | PyTorch | floor | ratio | command."""
    lines = []
    for name, a_ms, t_ms, ratio, a_rate, t_rate, _, floor_ms, _ in table:
        accrue = f"{a_ms} ms ({a_rate})" if a_rate != "—" else a_ms
        torch = f"{t_ms} ms ({t_rate})" if t_rate != "—" else t_ms
        floor = f"{floor_ms} ms" if floor_ms != "—" else "—"
        lines.append(f"| {gpu} | {name} | {accrue} | {torch} | {floor} | {ratio} | `{command}` |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accrue", nargs="+", required=True, help="Google Benchmark JSON file(s)")
    parser.add_argument("--torch", nargs="+",
                        help="JSON file(s) of torch_bench.py and torch_accumulation.py")
    parser.add_argument("--markdown", help="write the table here as a markdown fragment")
    parser.add_argument("--results-rows", help="write rows in bench/RESULTS.md's format here")
    parser.add_argument("--command", default="tools/gpu_check.sh",
                        help="the command named in --results-rows")
    args = parser.parse_args()

    a_context, accrue = load_accrue(args.accrue)
    t_context, torch = load_torch(args.torch) if args.torch else ({}, {})
    copy_gbps = a_context.get("copy_bandwidth_GBps")
    copy_bytes_per_s = float(copy_gbps) * 1e9 if copy_gbps else None
    gpu = a_context.get("gpu") or t_context.get("gpu") or "unknown GPU"
    if t_context.get("gpu") and a_context.get("gpu") and t_context["gpu"] != a_context["gpu"]:
        print(f"compare: warning: accrue ran on {a_context['gpu']}, PyTorch on {t_context['gpu']}",
              file=sys.stderr)

    rows = build_rows(accrue, torch, copy_bytes_per_s)
    table = build_table(rows)
    caption = (f"{gpu}; device-to-device copy {fmt(copy_bytes_per_s and copy_bytes_per_s * 1e-9, '.0f')}"
               f" GB/s (read + write); PyTorch {t_context.get('torch', '—')}; "
               f"ratio = accrue ms / PyTorch ms")
    # (title, header, rows) of the sections after the main table, when they have rows.
    sections = [(title, header, body) for title, header, body in [
        ("Accumulation targets", TARGET_HEADER, target_rows(rows)),
        ("Weight-gradient accumulation (PT = PyTorch; floor of accumulate = write)",
         WGRAD_HEADER, wgrad_rows(rows)),
        ("GEMM parity: every GEMM of a GPT-2 124M training step",
         GEMM_HEADER, parity_rows(rows, "gpt2_gemm/", GEMM_PARITY, "gpt2_gemm_torch_pattern/")),
        ("Convolution parity: ResNet-50's convolutions, micro-batch 64",
         CONV_HEADER, parity_rows(rows, "conv/", CONV_PARITY)),
    ] if body]
    print(caption)
    print(render_text(table))
    for title, header, body in sections:
        print(f"\n{title}\n{render_text(body, header)}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{caption}\n\n{render_markdown(table)}\n")
            for title, header, body in sections:
                f.write(f"\n**{title}**\n\n{render_markdown(body, header)}\n")
    if args.results_rows:
        with open(args.results_rows, "w") as f:
            f.write(results_rows(table, gpu, args.command) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

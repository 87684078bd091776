#!/usr/bin/env python3
"""Side-by-side table of accrue_bench and torch_bench.py results.

    python3 bench/compare.py --accrue bench.json --torch torch_bench.json \
        --markdown comparison.md [--results-rows rows.md --command "tools/gpu_check.sh"]

--accrue takes Google Benchmark JSON (--benchmark_out=FILE
--benchmark_out_format=json, or --benchmark_format=json on stdout); with
--benchmark_repetitions the median aggregate is used, else the mean of the
runs. --torch takes the JSON that torch_bench.py writes. Rows are matched by
benchmark name. ratio = accrue ms / PyTorch ms (below 1: accrue is faster).
copy frac = accrue's bytes/s over accrue's measured device-to-device copy
bandwidth; floor = the op's bytes at that bandwidth.
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


def load_torch(path):
    with open(path) as f:
        data = json.load(f)
    return data.get("context", {}), {b["name"]: b for b in data.get("benchmarks", [])}


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


def build_table(accrue, torch, copy_bytes_per_s):
    """Returns the rows as lists of strings, in accrue_bench's order, then torch-only rows."""
    names = list(accrue) + [n for n in torch if n not in accrue]
    table = []
    for name in names:
        a, t = accrue.get(name), torch.get(name)
        a_ms = a.get("ms") if a else None
        t_ms = t.get("ms") if t else None
        ratio = a_ms / t_ms if a_ms and t_ms else None
        nbytes = (a or {}).get("bytes") or (t or {}).get("bytes")
        floor_ms = nbytes / copy_bytes_per_s * 1e3 if nbytes and copy_bytes_per_s else None
        table.append([
            name,
            a["error"][:40] if a and "error" in a else fmt(a_ms, ".3f"),
            fmt(t_ms, ".3f"),
            fmt(ratio, ".2f"),
            rate(a) or "—",
            rate(t) or "—",
            fmt(a.get("copy_frac") if a else None, ".2f"),
            fmt(floor_ms, ".3f"),
        ])
    return table


HEADER = ["op", "accrue ms", "PyTorch ms", "ratio", "accrue rate", "PyTorch rate",
          "copy frac", "floor ms"]


def render_text(table):
    widths = [max(len(r[i]) for r in [HEADER] + table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in [HEADER] + table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(table):
    lines = ["| " + " | ".join(HEADER) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(HEADER) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    return "\n".join(lines)


def results_rows(table, gpu, command):
    """Rows in bench/RESULTS.md's format: GPU model | op | accrue | PyTorch | floor | ratio | command."""
    lines = []
    for name, a_ms, t_ms, ratio, a_rate, t_rate, _, floor_ms in table:
        accrue = f"{a_ms} ms ({a_rate})" if a_rate != "—" else a_ms
        torch = f"{t_ms} ms ({t_rate})" if t_rate != "—" else t_ms
        floor = f"{floor_ms} ms" if floor_ms != "—" else "—"
        lines.append(f"| {gpu} | {name} | {accrue} | {torch} | {floor} | {ratio} | `{command}` |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accrue", nargs="+", required=True, help="Google Benchmark JSON file(s)")
    parser.add_argument("--torch", help="torch_bench.py JSON file")
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

    table = build_table(accrue, torch, copy_bytes_per_s)
    caption = (f"{gpu}; device-to-device copy {fmt(copy_bytes_per_s and copy_bytes_per_s * 1e-9, '.0f')}"
               f" GB/s (read + write); PyTorch {t_context.get('torch', '—')}; "
               f"ratio = accrue ms / PyTorch ms")
    print(caption)
    print(render_text(table))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{caption}\n\n{render_markdown(table)}\n")
    if args.results_rows:
        with open(args.results_rows, "w") as f:
            f.write(results_rows(table, gpu, args.command) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

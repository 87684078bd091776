#!/usr/bin/env python3
"""Plots a trainer's --metrics file (JSON Lines, one object per window) as PNG.

    python3 tools/plot_metrics.py run.jsonl --out run.png

Four panels against the window: the training loss (and the validation loss
where measured), the gradient norm before and after clipping, the learning
rate, and the loss scale with the skipped windows marked. A fifth and sixth
when the file has per-layer figures (--layer-metrics-every): the
update-to-weight ratio, all parameters together and each layer, and the
layers' gradient norms. Needs matplotlib.
"""
import argparse
import json
import sys


def read(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot_metrics: {path}:{number}: not JSON ({e})")
            if "window" not in row:
                raise SystemExit(f"plot_metrics: {path}:{number}: no 'window' field")
            rows.append(row)
    if not rows:
        raise SystemExit(f"plot_metrics: {path} has no windows")
    return rows


def series(rows, key):
    """(windows, values) of the rows where key is a number."""
    points = [(r["window"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the JSON Lines file of --metrics")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default=None, help="a title (default: the file name)")
    args = parser.parse_args()
    rows = read(args.metrics)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2

    layer_keys = sorted({k for r in rows for k in r if k.startswith("update_ratio/")})
    panel_rows = 3 if layer_keys else 2
    fig, axes = plt.subplots(panel_rows, 2, figsize=(11, 3.5 * panel_rows), sharex=True)
    ax = axes[0][0]
    ax.plot(*series(rows, "loss"), label="train")
    w, v = series(rows, "val_loss")
    if w:
        ax.plot(w, v, "o-", label="validation")
    ax.set_ylabel("loss")
    ax.legend()
    ax = axes[0][1]
    ax.plot(*series(rows, "grad_norm"), label="before clipping")
    ax.plot(*series(rows, "grad_norm_clipped"), label="after clipping")
    ax.set_ylabel("gradient norm")
    ax.legend()
    ax = axes[1][0]
    ax.plot(*series(rows, "lr"))
    ax.set_ylabel("learning rate")
    ax.set_xlabel("window")
    ax = axes[1][1]
    ax.plot(*series(rows, "loss_scale"))
    skipped = [r["window"] for r in rows if r.get("skipped")]
    for s in skipped:
        ax.axvline(s, color="red", alpha=0.3)
    ax.set_yscale("log", base=2)
    ax.set_ylabel(f"loss scale ({len(skipped)} skipped windows in red)")
    ax.set_xlabel("window")
    if layer_keys:
        ax = axes[2][0]
        for key in layer_keys:
            ax.plot(*series(rows, key), color="grey", alpha=0.3, linewidth=0.8)
        ax.plot(*series(rows, "update_ratio"), color="black", label="all parameters")
        for key in sorted({k for r in rows for k in r if k.startswith("group_update_ratio/")}):
            ax.plot(*series(rows, key), label="group " + key.split("/", 1)[1])
        ax.set_yscale("log")
        ax.set_ylabel("update / weight (grey: layers)")
        ax.legend()
        ax.set_xlabel("window")
        ax = axes[2][1]
        for key in sorted(k.replace("update_ratio/", "grad_norm/") for k in layer_keys):
            ax.plot(*series(rows, key), alpha=0.5, linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("gradient norm per layer")
        ax.set_xlabel("window")
    fig.suptitle(args.title or args.metrics)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"plot_metrics: {len(rows)} windows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

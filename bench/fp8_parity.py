#!/usr/bin/env python3
"""FP8 against bf16 over a long run: the same model, data, seed and schedule
trained once per recipe, the validation losses compared and plotted.

    python3 bench/fp8_parity.py --accrue-bin build-dev/examples/accrue_train \\
        --models gpt2-d12,llama-125m --recipes bf16,tensor,block --windows 2000 \\
        --gpus 0,1 --out-dir /tmp/parity

The data is real text found offline: by default the Python standard
library's sources (`*.py` under the running interpreter's stdlib directory,
sorted), one document per file, as byte tokens 0..255 with an EOS of 256
after each document (tools/make_shards.py; --text-dir picks another tree).
GPT-2 reads the shards as contiguous rows (its trainer takes no EOS id);
the Llama models pack the documents with attention that never crosses one
(--eos-id 256). The first --val-fraction of the tokens is the validation
split; every run evaluates the same --val-batches micro-batches from its
start every --val-every windows and at the end.

Every run of a model gets the same arguments but the recipe's: bf16 compute
(`--dtype bf16`), or `--fp8 --fp8-recipe tensor|block` on top of it, with
--cuda-graphs, the same seed (weights and data order), AdamW with warmup and
cosine decay, clip 1. Runs go one per GPU of --gpus at a time. Each run's
--metrics file (JSON Lines, one object per window) is kept under --out-dir.

The verdict, per model and FP8 recipe: the final validation loss within
--tolerance (0.5% by default) of bf16's, |fp8 / bf16 - 1|. Writes
OUT_DIR/parity.json, OUT_DIR/parity.md and OUT_DIR/parity_MODEL.png (the
training loss, a moving average, and the validation loss of every recipe
against the window; needs matplotlib) and prints the table.

--dry-run prints the commands without running anything; --cpu with
--models gpt2-tiny runs the whole script on the CPU.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_SHARDS = os.path.join(HERE, "..", "tools", "make_shards.py")
EOS = 256  # the byte tokens' end of document (make_shards.py --eos-id)

# Per model: micro-batch, sequence length, K (32,768 tokens a window but for the tiny one),
# peak lr, and arguments of its own.
SHAPES = {
    "gpt2-d12": (16, 1024, 2, 6e-4, []),
    "llama-125m": (8, 2048, 2, 6e-4, []),
    "gpt2-d48": (4, 1024, 8, 2e-4, []),
    # For checking the script on the CPU (--cpu); its vocabulary of 256 grown for the EOS.
    "gpt2-tiny": (2, 64, 2, 1e-3, ["--vocab-size", "320"]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accrue-bin", required=True, help="accrue_train")
    p.add_argument("--models", default="gpt2-d12,llama-125m",
                   help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--recipes", default="bf16,tensor,block",
                   help="comma-separated: bf16 (the reference, always run), tensor, block")
    p.add_argument("--windows", type=int, default=2000)
    p.add_argument("--warmup-windows", type=int, default=None,
                   help="the lr's linear warmup (default: windows / 20)")
    p.add_argument("--val-every", type=int, default=100)
    p.add_argument("--val-batches", type=int, default=20)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--tolerance", type=float, default=0.005,
                   help="the largest |fp8 / bf16 - 1| of the final validation loss")
    p.add_argument("--text-dir", default=None,
                   help="the text tree (default: the Python standard library's directory)")
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices, one run on each")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU without CUDA graphs (the tiny models: checks the script)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in SHAPES:
            p.error(f"--models: {m!r} is not one of {', '.join(SHAPES)}")
    recipes = [r for r in args.recipes.split(",") if r]
    for r in recipes:
        if r not in ("bf16", "tensor", "block"):
            p.error(f"--recipes: {r!r} is not bf16, tensor or block")
    args.recipes = ["bf16"] + [r for r in recipes if r != "bf16"]
    args.gpus = [g for g in args.gpus.split(",") if g]
    if not args.gpus:
        p.error("--gpus: no GPU given")
    if args.windows < 1 or args.val_every < 0 or args.val_batches < 1:
        p.error("--windows and --val-batches must be positive, --val-every not negative")
    if args.warmup_windows is None:
        args.warmup_windows = max(1, args.windows // 20)
    return args


def text_files(root):
    """The *.py files under root, sorted (the same order, so the same shards, everywhere)."""
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    # Generated or vendored trees would weigh one package heavily: the sources only.
    return [f for f in files if "site-packages" not in f and os.path.isfile(f)]


def make_data(args):
    """Writes the shards once under OUT_DIR/data; returns (train glob, val glob, token count)."""
    prefix = os.path.join(args.out_dir, "data", "text")
    train, val = prefix + "_train_*.bin", prefix + "_val_*.bin"
    root = args.text_dir or sysconfig.get_paths()["stdlib"]
    files = text_files(root)
    if not files:
        raise SystemExit(f"fp8_parity: no *.py files under {root}")
    tokens = sum(os.path.getsize(f) + 1 for f in files)  # a byte a token, an EOS a file
    if not args.dry_run and not glob.glob(train):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        subprocess.run([sys.executable, MAKE_SHARDS, *files, "--output-prefix", prefix,
                        "--eos-id", str(EOS), "--val-fraction", str(args.val_fraction)],
                       check=True, stdout=subprocess.DEVNULL)
    print(f"data: {len(files)} files under {root}, {tokens:,} byte tokens "
          f"({args.val_fraction:.0%} validation)")
    return train, val, tokens


def command(args, model, recipe, train, val, metrics):
    b, t, k, lr, own = SHAPES[model]
    cmd = [args.accrue_bin, "--model", model, "--train-data", train, "--val-data", val,
           "--dtype", "bf16", "--micro-batch", str(b), "--seq-len", str(t), "--accum", str(k),
           "--windows", str(args.windows), "--lr", str(lr),
           "--warmup-windows", str(args.warmup_windows), "--max-grad-norm", "1",
           "--val-every", str(args.val_every), "--val-batches", str(args.val_batches),
           "--seed", str(args.seed), "--metrics", metrics, *own]
    cmd += ["--cpu"] if args.cpu else ["--cuda-graphs"]
    if not model.startswith("gpt2"):
        cmd += ["--eos-id", str(EOS)]
    if recipe != "bf16":
        cmd += ["--fp8", "--fp8-recipe", recipe]
    return cmd


def run_all(args, jobs):
    """Runs the (name, command) jobs, one per GPU of --gpus at a time; returns {name: rc}."""
    pending, running, rcs = list(jobs), {}, {}
    free = list(args.gpus)
    while pending or running:
        while pending and free:
            name, cmd = pending.pop(0)
            gpu = free.pop(0)
            log = open(os.path.join(args.out_dir, name + ".log"), "w")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[name] = (proc, gpu, log, time.time())
            print(f"start {name} on GPU {gpu}", flush=True)
        time.sleep(1)
        for name, (proc, gpu, log, start) in list(running.items()):
            if proc.poll() is None and time.time() - start > args.timeout:
                proc.kill()
                proc.wait()
            if proc.poll() is not None:
                log.close()
                rcs[name] = proc.returncode
                free.append(gpu)
                del running[name]
                print(f"done  {name}: rc {proc.returncode}, {time.time() - start:.0f} s",
                      flush=True)
    return rcs


def read_metrics(path):
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return rows


def final_val(rows):
    vals = [r["val_loss"] for r in rows if isinstance(r.get("val_loss"), (int, float))]
    return vals[-1] if vals else None


def moving_average(xs, n):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        if len(acc) > n:
            acc.pop(0)
        out.append(statistics.fmean(acc))
    return out


def plot(args, model, runs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fp8_parity: no matplotlib, no plot", file=sys.stderr)
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for recipe, rows in runs.items():
        w = [r["window"] for r in rows if isinstance(r.get("loss"), (int, float))]
        loss = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
        left.plot(w, moving_average(loss, 20), label=recipe, linewidth=1)
        vw = [r["window"] for r in rows if isinstance(r.get("val_loss"), (int, float))]
        vl = [r["val_loss"] for r in rows if isinstance(r.get("val_loss"), (int, float))]
        right.plot(vw, vl, marker="o", markersize=3, label=recipe)
    left.set(title=f"{model}: training loss (moving average of 20)", xlabel="window",
             ylabel="loss")
    right.set(title=f"{model}: validation loss", xlabel="window", ylabel="loss")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = os.path.join(args.out_dir, f"parity_{model}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    train, val, tokens = make_data(args)
    jobs = []
    for model in args.models:
        for recipe in args.recipes:
            name = f"{model}_{recipe}"
            metrics = os.path.join(args.out_dir, name + ".jsonl")
            jobs.append((name, command(args, model, recipe, train, val, metrics)))
    if args.dry_run:
        for name, cmd in jobs:
            print(name + ": " + " ".join(cmd))
        return 0
    rcs = run_all(args, jobs)
    results, lines = [], ["| model | recipe | final val loss | / bf16 | within "
                          f"{args.tolerance:.1%} | last train loss | rc |",
                          "|---|---|---:|---:|---|---:|---:|"]
    ok = True
    for model in args.models:
        runs = {r: read_metrics(os.path.join(args.out_dir, f"{model}_{r}.jsonl"))
                for r in args.recipes}
        ref = final_val(runs["bf16"])
        for recipe, rows in runs.items():
            v = final_val(rows)
            ratio = v / ref if v is not None and ref else None
            verdict = ("reference" if recipe == "bf16" else
                       "no figure" if ratio is None else
                       "PASS" if abs(ratio - 1) <= args.tolerance else "MISS")
            ok = ok and verdict in ("reference", "PASS")
            last = rows[-1]["loss"] if rows else None
            results.append({"model": model, "recipe": recipe, "windows": len(rows),
                            "final_val_loss": v, "ratio_to_bf16": ratio, "verdict": verdict,
                            "last_train_loss": last, "rc": rcs.get(f"{model}_{recipe}")})
            lines.append(f"| {model} | {recipe} | {v if v is None else f'{v:.4f}'} | "
                         f"{'' if ratio is None else f'{ratio:.4f}'} | {verdict} | "
                         f"{last if last is None else f'{last:.4f}'} | "
                         f"{rcs.get(f'{model}_{recipe}')} |")
        png = plot(args, model, runs)
        if png:
            lines.append(f"\n{model}: {png}\n")
    with open(os.path.join(args.out_dir, "parity.json"), "w") as f:
        json.dump({"windows": args.windows, "tokens": tokens, "tolerance": args.tolerance,
                   "results": results}, f, indent=1)
    with open(os.path.join(args.out_dir, "parity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

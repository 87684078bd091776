#!/usr/bin/env python3
"""FP8 against bf16 over a long run: the same model, data, seeds and schedule
trained once per recipe and seed, the validation losses compared and plotted.

    python3 bench/fp8_parity.py --accrue-bin build-dev/examples/accrue_train \\
        --models gpt2-d12,llama-125m --recipes bf16,tensor,block --windows 2000 \\
        --seeds 1,2 --text-dir /usr/lib/python3.12,/usr/lib/python3/dist-packages \\
        --gpus 0,1 --out-dir /tmp/parity

The data is real text found offline: by default the Python standard
library's sources (`*.py` under the running interpreter's stdlib directory),
one document per file, as byte tokens 0..255 with an EOS of 256 after each
document (tools/make_shards.py). --text-dir takes other roots, comma-separated:
each root's files sorted, the roots in the order given, a file once. Trees
named site-packages below a root are left out (vendored copies would weigh
one package heavily), but a root may itself be a site-packages directory.
GPT-2 reads the shards as contiguous rows (its trainer takes no EOS id),
and so do the Llama models by default (--llama-documents rows:
accrue_train --contiguous-rows). --llama-documents packed packs the
documents with attention that never crosses one (--eos-id 256): attention
within each row through a document bias (Note [Documents within rows]),
not yet measured here; before that path, the packed offsets on the device
took the composed path over the whole micro-batch, and llama-125m trained
at 13.8k tok/s that way on an H200 under CUDA graphs (175 of 2,000 windows
in 420 s). The first
--val-fraction of the tokens is the validation split. Sorted, that is the
first files of the first root, and training reads one package after another,
so the validation loss swings with what was read last. --shuffle-files SEED
puts the files in an order drawn from SEED first: a validation split from
every root, and a training stream that mixes them. Every run evaluates the
same --val-batches micro-batches from its start every --val-every windows and
at the end.

Every run of a model gets the same arguments but the recipe's and the seed's:
bf16 compute (`--dtype bf16`), or on top of it a recipe's FP8 flags (FP8_FLAGS:
tensor, block, delayed, and tensor-e4m3 / delayed-e4m3 with the output
gradients in e4m3 instead of e5m2), and `--seed N`, with --cuda-graphs, AdamW with warmup and cosine decay,
clip 1. The seed draws the weights (and any dropout); the data order depends
only on the files, so it is every run's. A run is one (model, recipe, seed),
named MODEL_RECIPE for seed 1 alone, else MODEL_RECIPE_sSEED. Runs go one
per GPU of --gpus at a time. Each run's --metrics file (JSON Lines, one object
per window) is kept under --out-dir.

The verdict, per model and FP8 recipe: the final validation loss, the mean
over the seeds, within --tolerance (0.5% by default) of bf16's mean,
|fp8 / bf16 - 1|. With several seeds each recipe also gets its seed spread,
(max - min) / mean of its final validation losses, and each FP8 recipe is
told whether its gap to bf16 lies within bf16's spread: a gap the seeds alone
would give is noise, not FP8 (reported, not part of the verdict). Writes
OUT_DIR/parity.json, OUT_DIR/parity.md and OUT_DIR/parity_MODEL.png (the
training loss, a moving average, and the validation loss of every recipe and
seed against the window; needs matplotlib) and prints the table.

--reuse DIR[,DIR...] takes a run's metrics from an earlier output directory
instead of running it again, where that directory holds the whole run (every
window, the final validation) with the same identity: the same command but
for the paths of the binary, the shards and the metrics, and shards made from
the same files in the same order and split (NAME.run.json, written as each run
starts). So a sweep cut short by a time limit goes on where it stopped, and a
bf16 reference already run is not run again beside a new recipe. The binary's
build is not part of the identity: reuse across builds only where the code of
the reused recipe did not change.

--dry-run prints the commands without running anything; --cpu with
--models gpt2-tiny runs the whole script on the CPU.
"""
import argparse
import glob
import hashlib
import json
import os
import random
import shutil
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

# Each FP8 recipe's accrue_train flags over bf16's. delayed: the tensor recipe with
# delayed scaling (Note [FP8 delayed scaling]); -e4m3: the output gradients in e4m3
# (3 mantissa bits, to 448) instead of e5m2 (2 mantissa bits, to 57,344).
FP8_FLAGS = {
    "tensor": ["--fp8", "--fp8-recipe", "tensor"],
    "block": ["--fp8", "--fp8-recipe", "block"],
    "delayed": ["--fp8", "--fp8-recipe", "tensor", "--fp8-scaling", "delayed"],
    "tensor-e4m3": ["--fp8", "--fp8-recipe", "tensor", "--fp8-grad-dtype", "e4m3"],
    "delayed-e4m3": ["--fp8", "--fp8-recipe", "tensor", "--fp8-scaling", "delayed",
                     "--fp8-grad-dtype", "e4m3"],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accrue-bin", required=True, help="accrue_train")
    p.add_argument("--models", default="gpt2-d12,llama-125m",
                   help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--recipes", default="bf16,tensor,block",
                   help="comma-separated: bf16 (the reference, always run), "
                   + ", ".join(FP8_FLAGS))
    p.add_argument("--windows", type=int, default=2000)
    p.add_argument("--warmup-windows", type=int, default=None,
                   help="the lr's linear warmup (default: windows / 20)")
    p.add_argument("--val-every", type=int, default=100)
    p.add_argument("--val-batches", type=int, default=20)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--tolerance", type=float, default=0.005,
                   help="the largest |fp8 / bf16 - 1| of the final validation loss")
    p.add_argument("--text-dir", default=None,
                   help="comma-separated roots of the *.py text, in this order (default: the "
                   "Python standard library's directory)")
    p.add_argument("--shuffle-files", type=int, default=None, metavar="SEED",
                   help="put the files in an order drawn from SEED before the split, so that "
                   "validation samples every root and training reads them mixed (default: "
                   "sorted, root by root)")
    p.add_argument("--llama-documents", choices=("rows", "packed"), default="rows",
                   help="the Llama models read contiguous rows across documents (default), or "
                   "packed documents with attention within each (--eos-id)")
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices, one run on each")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a run")
    p.add_argument("--seeds", default="1",
                   help="comma-separated seeds of the weights, each recipe run once per seed "
                   "(several: the seed-noise floor)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--reuse", default="",
                   help="comma-separated earlier output directories whose whole runs of the "
                   "same identity are taken instead of running them again")
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
        if r != "bf16" and r not in FP8_FLAGS:
            p.error(f"--recipes: {r!r} is not bf16, " + ", ".join(FP8_FLAGS))
    args.recipes = ["bf16"] + [r for r in recipes if r != "bf16"]
    args.gpus = [g for g in args.gpus.split(",") if g]
    if not args.gpus:
        p.error("--gpus: no GPU given")
    if args.windows < 1 or args.val_every < 0 or args.val_batches < 1:
        p.error("--windows and --val-batches must be positive, --val-every not negative")
    if args.warmup_windows is None:
        args.warmup_windows = max(1, args.windows // 20)
    args.seeds = seeds(p, args.seeds)
    args.reuse = [d for d in args.reuse.split(",") if d]
    args.text_dirs = ([d for d in args.text_dir.split(",") if d] if args.text_dir
                      else [sysconfig.get_paths()["stdlib"]])
    if not args.text_dirs:
        p.error("--text-dir: no directory given")
    return args


def seeds(p, text):
    """--seeds as a list of ints; a bad one is an argparse error (exit 2)."""
    out = []
    for word in text.split(","):
        try:
            seed = int(word)
        except ValueError:
            p.error(f"--seeds: {word!r} is not an integer")
        # accrue_train refuses a negative seed; two runs of one seed would share a name.
        if seed < 0 or seed in out:
            p.error(f"--seeds: {seed} is " + ("negative" if seed < 0 else "given twice"))
        out.append(seed)
    return out


def text_files(roots):
    """The *.py files under each root, sorted, the roots in order, a file once (the same
    order, so the same shards, everywhere)."""
    out, seen = [], set()
    for root in roots:
        for f in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            # Generated or vendored trees would weigh one package heavily: the sources only.
            # Below the root only, so that a root may be a site-packages directory itself.
            if "site-packages" in os.path.relpath(f, root) or not os.path.isfile(f):
                continue
            # Nested or repeated roots reach a file twice.
            if os.path.realpath(f) not in seen:
                seen.add(os.path.realpath(f))
                out.append(f)
    return out


def make_data(args):
    """Writes the shards once under OUT_DIR/data; returns (train glob, val glob, token count,
    the digest of the files and split the shards hold)."""
    prefix = os.path.join(args.out_dir, "data", "text")
    train, val = prefix + "_train_*.bin", prefix + "_val_*.bin"
    roots = ", ".join(args.text_dirs)
    files = text_files(args.text_dirs)
    if not files:
        raise SystemExit(f"fp8_parity: no *.py files under {roots}")
    if args.shuffle_files is not None:
        # Sorted, the first files (the validation split) are one package's and training reads
        # package after package, so the validation loss follows what was read last.
        random.Random(args.shuffle_files).shuffle(files)
    tokens = sum(os.path.getsize(f) + 1 for f in files)  # a byte a token, an EOS a file
    # The shards are made once per output directory and name the files and split they hold:
    # a later call with other roots or another split writes them again, never trains on old text.
    made_from = {"files": files, "val_fraction": args.val_fraction}
    manifest = prefix + "_sources.json"
    if not args.dry_run:
        current = None
        if os.path.exists(manifest):
            with open(manifest, encoding="utf-8") as f:
                current = json.load(f)
        if current != made_from or not glob.glob(train):
            for old in glob.glob(train) + glob.glob(val):
                os.remove(old)
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            # The names go in a list file: a site-packages holds more than a command line.
            file_list = prefix + "_files.txt"
            with open(file_list, "w", encoding="utf-8") as f:
                f.writelines(name + "\n" for name in files)
            subprocess.run([sys.executable, MAKE_SHARDS, "--inputs-from", file_list,
                            "--output-prefix", prefix, "--eos-id", str(EOS),
                            "--val-fraction", str(args.val_fraction)],
                           check=True, stdout=subprocess.DEVNULL)
            with open(manifest, "w", encoding="utf-8") as f:
                json.dump(made_from, f)
    order = ("sorted" if args.shuffle_files is None
             else f"shuffled with seed {args.shuffle_files}")
    print(f"data: {len(files)} files under {roots}, {tokens:,} byte tokens "
          f"({args.val_fraction:.0%} validation), files {order}")
    digest = hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()
    return train, val, tokens, digest


def identity(cmd, data_digest):
    """What makes two runs the same (--reuse): the command but for the paths of this call's
    binary, shards and metrics, and the digest of the files and split of the shards."""
    words = ["ACCRUE_BIN"] + list(cmd[1:])
    for flag in ("--train-data", "--val-data", "--metrics"):
        words[words.index(flag) + 1] = "PATH"
    return {"command": words, "data": data_digest}


def finished_run(directory, name, ident, windows):
    """NAME's metrics file in directory when it holds the whole run (every window, a final
    validation loss) of this identity; else None."""
    try:
        with open(os.path.join(directory, name + ".run.json"), encoding="utf-8") as f:
            if json.load(f) != ident:
                return None
        rows = read_metrics(os.path.join(directory, name + ".jsonl"))
    except (OSError, ValueError):  # no record, or a metrics line cut short
        return None
    whole = (len(rows) == windows and [r.get("window") for r in rows] == list(range(1, windows + 1))
             and isinstance(rows[-1].get("val_loss"), (int, float)))
    return os.path.join(directory, name + ".jsonl") if whole else None


def take_reused(args, name, ident):
    """Copies NAME's files from the first --reuse directory that holds its whole run into
    --out-dir; returns that directory, or None."""
    for directory in args.reuse:
        if finished_run(directory, name, ident, args.windows) is None:
            continue
        if os.path.realpath(directory) != os.path.realpath(args.out_dir):
            for ext in (".jsonl", ".run.json", ".log"):
                source = os.path.join(directory, name + ext)
                if os.path.exists(source):
                    shutil.copyfile(source, os.path.join(args.out_dir, name + ext))
        return directory
    return None


def run_name(args, model, recipe, seed):
    # Seed 1 alone keeps the names of before, so earlier output directories still read; any
    # other seed is in the name, so that runs of other seeds into one directory never
    # overwrite each other's metrics.
    return f"{model}_{recipe}" if args.seeds == [1] else f"{model}_{recipe}_s{seed}"


def command(args, model, recipe, seed, train, val, metrics):
    b, t, k, lr, own = SHAPES[model]
    cmd = [args.accrue_bin, "--model", model, "--train-data", train, "--val-data", val,
           "--dtype", "bf16", "--micro-batch", str(b), "--seq-len", str(t), "--accum", str(k),
           "--windows", str(args.windows), "--lr", str(lr),
           "--warmup-windows", str(args.warmup_windows), "--max-grad-norm", "1",
           "--val-every", str(args.val_every), "--val-batches", str(args.val_batches),
           "--seed", str(seed), "--metrics", metrics, *own]
    cmd += ["--cpu"] if args.cpu else ["--cuda-graphs"]
    if not model.startswith("gpt2"):
        cmd += (["--contiguous-rows"] if args.llama_documents == "rows"
                else ["--eos-id", str(EOS)])
    if recipe != "bf16":
        cmd += FP8_FLAGS[recipe]
    return cmd


def check_gpus(gpus):
    """Refuses a --gpus index that no GPU has (nvidia-smi -L counts them): accrue_train under
    CUDA_VISIBLE_DEVICES set to a missing GPU sees none and trains on the CPU, for hours."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"fp8_parity: --gpus {','.join(gpus)}: cannot list the GPUs with "
                         f"nvidia-smi -L ({e}); --cpu runs the tiny models on the CPU")
    count = sum(line.startswith("GPU ") for line in listing.splitlines())
    for g in gpus:
        if not g.isdigit() or int(g) >= count:
            raise SystemExit(f"fp8_parity: --gpus: GPU {g!r} is not one of this machine's "
                             f"{count} (0 to {count - 1})")


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


def number(x):
    return x if isinstance(x, (int, float)) else None


def mean(xs):
    """The mean, or None where a figure is missing (a run that failed has no say)."""
    return statistics.fmean(xs) if xs and None not in xs else None


def spread(xs):
    """(max - min) / mean of one recipe's figures over the seeds; None with one seed."""
    m = mean(xs)
    return (max(xs) - min(xs)) / m if len(xs) > 1 and m else None


def paired_ratios(vals, ref_vals):
    """Each seed's final loss over bf16's of the same seed (None where either is missing):
    the seeds pair the runs (the same initial weights and data order), so a gap that keeps
    its sign and size over enough seeds is the recipe's, where one that changes sign may be
    the seeds'."""
    return [v / r if v is not None and r else None for v, r in zip(vals, ref_vals)]


def f4(x):
    return "None" if x is None else f"{x:.4f}"


def plot(args, model, runs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fp8_parity: no matplotlib, no plot", file=sys.stderr)
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = ["-", "--", ":", "-."]  # one a seed, the first solid; more seeds than styles repeat
    for i, (recipe, seed_rows) in enumerate(runs.items()):
        for j, (seed, rows) in enumerate(zip(args.seeds, seed_rows)):
            label = recipe if len(args.seeds) == 1 else f"{recipe} s{seed}"
            style = {"color": f"C{i}", "linestyle": styles[j % len(styles)], "label": label}
            w = [r["window"] for r in rows if number(r.get("loss")) is not None]
            loss = [r["loss"] for r in rows if number(r.get("loss")) is not None]
            left.plot(w, moving_average(loss, 20), linewidth=1, **style)
            vw = [r["window"] for r in rows if number(r.get("val_loss")) is not None]
            vl = [r["val_loss"] for r in rows if number(r.get("val_loss")) is not None]
            right.plot(vw, vl, marker="o", markersize=3, **style)
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
    if not args.cpu and not args.dry_run:
        check_gpus(args.gpus)
    os.makedirs(args.out_dir, exist_ok=True)
    train, val, tokens, data_digest = make_data(args)
    jobs, reused = [], {}
    for model in args.models:
        # Every recipe of a seed before the next seed: a sweep cut short leaves whole seeds.
        for seed in args.seeds:
            for recipe in args.recipes:
                name = run_name(args, model, recipe, seed)
                metrics = os.path.join(args.out_dir, name + ".jsonl")
                cmd = command(args, model, recipe, seed, train, val, metrics)
                found = None if args.dry_run else take_reused(args, name,
                                                              identity(cmd, data_digest))
                if found is not None:
                    reused[name] = found
                    print(f"reuse {name} from {found}", flush=True)
                else:
                    jobs.append((name, cmd))
    if args.dry_run:
        for name, cmd in jobs:
            print(name + ": " + " ".join(cmd))
        return 0
    for name, cmd in jobs:  # before the run starts: a run cut short is never taken whole
        with open(os.path.join(args.out_dir, name + ".run.json"), "w", encoding="utf-8") as f:
            json.dump(identity(cmd, data_digest), f)
    rcs = run_all(args, jobs)
    rcs.update({name: 0 for name in reused})
    seeds = ",".join(str(s) for s in args.seeds)
    results, lines, ok = [], [], True
    for model in args.models:
        # A table a model: the lines under it would end a shared one in Markdown.
        if lines:
            lines.append("")
        lines += ["| model | recipe | seeds | final val loss | per seed | / bf16 | per seed / bf16 "
                  f"| within {args.tolerance:.1%} | seed spread | last train loss | rc |",
                  "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        # Per recipe, the metrics rows of each seed's run, in seed order.
        runs = {r: [read_metrics(os.path.join(args.out_dir, run_name(args, model, r, s) + ".jsonl"))
                    for s in args.seeds] for r in args.recipes}
        ref_vals = [final_val(rows) for rows in runs["bf16"]]
        ref, ref_spread = mean(ref_vals), spread(ref_vals)
        gaps = []
        for recipe, seed_rows in runs.items():
            vals = [final_val(rows) for rows in seed_rows]
            v, v_spread = mean(vals), spread(vals)
            ratio = v / ref if v is not None and ref else None
            paired = paired_ratios(vals, ref_vals)
            verdict = ("reference" if recipe == "bf16" else
                       "no figure" if ratio is None else
                       "PASS" if abs(ratio - 1) <= args.tolerance else "MISS")
            ok = ok and verdict in ("reference", "PASS")
            # A gap no larger than bf16's own spread over the seeds could be the seeds alone.
            within = None
            if recipe != "bf16" and ratio is not None and ref_spread is not None:
                within = abs(ratio - 1) <= ref_spread
            if recipe != "bf16":
                gaps.append(f"{recipe} no figure" if ratio is None else
                            f"{recipe} {ratio - 1:+.2%} from bf16, " +
                            ("no spread to compare" if within is None else
                             "within it" if within else "outside it"))
            last = mean([number(rows[-1].get("loss")) if rows else None for rows in seed_rows])
            run_rcs = [rcs.get(run_name(args, model, recipe, s)) for s in args.seeds]
            rc = next((c for c in run_rcs if c != 0), 0)
            results.append({"model": model, "recipe": recipe, "windows": len(seed_rows[0]),
                            "final_val_losses": vals, "final_val_loss": v, "ratio_to_bf16": ratio,
                            "ratios_to_bf16_per_seed": paired,
                            "verdict": verdict, "seed_spread": v_spread,
                            "within_bf16_seed_spread": within, "last_train_loss": last,
                            "rc": rc, "rcs": run_rcs})
            lines.append(f"| {model} | {recipe} | {seeds} | {f4(v)} | "
                         f"{', '.join(f4(x) for x in vals)} | "
                         f"{'' if ratio is None else f'{ratio:.4f}'} | "
                         f"{'' if recipe == 'bf16' else ', '.join(f4(x) for x in paired)} | "
                         f"{verdict} | "
                         f"{'' if v_spread is None else f'{v_spread:.2%}'} | {f4(last)} | {rc} |")
        if len(args.seeds) > 1:
            lines += ["", f"{model}: bf16's seed spread over seeds {seeds}: "
                      + ("no figure" if ref_spread is None else f"{ref_spread:.2%}")
                      + "".join(f"; {g}" for g in gaps)]
        png = plot(args, model, runs)
        if png:
            lines += ["", f"{model}: {png}"]
    with open(os.path.join(args.out_dir, "parity.json"), "w") as f:
        json.dump({"windows": args.windows, "tokens": tokens, "tolerance": args.tolerance,
                   "seeds": args.seeds, "text_dirs": args.text_dirs,
                   "shuffle_files": args.shuffle_files, "reused": reused, "results": results},
                  f, indent=1)
    with open(os.path.join(args.out_dir, "parity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

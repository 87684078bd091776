#!/usr/bin/env python3
"""GPT-2 on 2 GPUs: accrue's data parallelism beside PyTorch DDP, and each side on 1 GPU.

    python3 bench/gpt2_dp_bench.py --accrue-bin build/gpu/examples/accrue_train_gpt2 \\
        --out gpt2_dp.md --log-dir gpt2_dp_logs

Runs, each in its own subprocess, one after the other on the same machine, for
each (B, K) of --points (default (8,4) and (4,8)):

  accrue, 1 GPU:       accrue_train_gpt2 --bench --synthetic --model d12 --dtype bf16
                           --seq-len 1024 --micro-batch B --total-batch-tokens 32768 ...
  accrue, 2 GPUs:      torchrun --standalone --nproc-per-node=2 --no-python
                           accrue_train_gpt2 ... --total-batch-tokens 65536
  PyTorch DDP, 2 GPUs: torchrun --standalone --nproc-per-node=2 bench/torch_gpt2.py
                           --micro-batch B --k K ...
  PyTorch, 1 GPU:      bench/torch_gpt2.py --micro-batch B --k K ...

Every GPU gets the same work in every run: K micro-batches of B x 1024 tokens
per window (32 x 1024 tokens); on 2 GPUs the global batch doubles (the
trainer's K = total-batch-tokens / (B x 1024 x world size) stays K). tokens/s
counts the tokens of ALL ranks on both sides: accrue_train_gpt2 prints one
JSON line from rank 0 (the other ranks' stdout goes to /dev/null) whose
tokens per window are B x T x world size x K, and torch_gpt2.py prints one
from rank 0 with the window time the largest over ranks. PyTorch DDP uses
bucket_cap_mb 25, gradient_as_bucket_view=True and no_sync() for the first
K - 1 micro-steps (see torch_gpt2.py); accrue all-reduces its buckets during
the last micro-step's backward (dist/reducer.h).

Ranks: torchrun --standalone hosts its own rendezvous store on a free port and
exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (that store's port) to each process. accrue reads them
(dist/launch_env.h) and sends the NCCL id over its TCP exchange on
MASTER_PORT + 1 (dist/tcp_exchange.h), which is free in practice; a 2-GPU
accrue run whose exchange could not listen there is run once more (a fresh
store port). torchrun is `python3 -m torch.distributed.run` with this
interpreter (--torchrun to change it).

Every child runs with NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on shared
machines; also TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) and
without any launcher variables this script inherited (RANK, WORLD_SIZE, ...,
OMPI_*, SLURM_*), so the 1-GPU runs are world size 1.

Prints a markdown table (and writes it with --out): tokens/s of the four
runs, accrue 2 GPUs / 1 GPU, PyTorch DDP 2 GPUs / 1 GPU, accrue 2 GPUs /
PyTorch DDP 2 GPUs, and the reference figures of PyTorch DDP no_sync measured
earlier on 2 x H200 (DDP_NO_SYNC_2XH200) with accrue 2 GPUs against them; then
peak memory per GPU. --json writes every run's parsed row; --log-dir keeps each
run's command, stdout and stderr; --dry-run prints the commands and runs
nothing. Exit status: 0 when every accrue run gave a figure, else 1.
"""
import argparse
import json
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bench import (SEQ_LEN, accrue_cmd, default_accrue_bin, fmt, fmt_rate,  # noqa: E402
                        gpu_name, last_json_line, normalize, ok, parse_points, run_logged,
                        torch_cmd)

DEFAULT_POINTS = [(8, 4), (4, 8)]
# tokens/s of PyTorch DDP with no_sync (bucket_cap_mb 25, gradient_as_bucket_view)
# on 2 x H200, GPT-2 d12 bf16, 32 x 1024 tokens per GPU per window, by (B, K).
DDP_NO_SYNC_2XH200 = {(8, 4): 617092, (4, 8): 461597}

# The runs of each point: (impl, world size, label).
RUNS = [("accrue", 1, "accrue 1 GPU"), ("accrue", 2, "accrue 2 GPUs"),
        ("torch_ddp", 2, "PyTorch DDP 2 GPUs"), ("torch", 1, "PyTorch 1 GPU")]

# What a launcher leaves in the environment: none of it may reach a child (the
# 1-GPU runs must be world size 1; torchrun sets its own).
LAUNCHER_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                 "SLURM_NODEID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
# NVLink multicast off, as tools/multi_gpu_check.sh sets it.
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1"}
# The exchange's error when MASTER_PORT + 1 is taken (dist/tcp_exchange.cpp).
PORT_TAKEN = "cannot listen on port"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--accrue-bin", default=default_accrue_bin(),
                   help="the accrue_train_gpt2 binary (default: the first built one found)")
    p.add_argument("--points", default=",".join(f"{b}x{k}" for b, k in DEFAULT_POINTS),
                   help="BxK points: micro-batch B, K micro-steps per window on each GPU")
    p.add_argument("--nproc", type=int, default=2, help="GPUs of the data-parallel runs")
    p.add_argument("--warmup", type=int, default=3, help="untimed windows per run")
    p.add_argument("--windows", type=int, default=10, help="timed windows per run")
    p.add_argument("--timeout", type=int, default=180, help="seconds per run")
    p.add_argument("--torchrun", default=f"{shlex.quote(sys.executable)} -m torch.distributed.run",
                   help="the torchrun command (default: this Python's torch.distributed.run)")
    p.add_argument("--accrue-args", default="", help="extra options for accrue_train_gpt2")
    p.add_argument("--torch-args", default="", help="extra options for torch_gpt2.py")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for torch_gpt2.py's MFU (default: from the GPU's name)")
    p.add_argument("--skip-torch", action="store_true", help="accrue only")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--out", help="write the markdown tables to this file")
    p.add_argument("--json", help="write every run's parsed row to this file (a list)")
    p.add_argument("--log-dir", help="keep each run's command, stdout and stderr here")
    args = p.parse_args()
    args.points = parse_points(args.points)
    if args.nproc < 2:
        p.error(f"--nproc {args.nproc}: the data-parallel runs need at least 2 GPUs")
    if args.warmup < 0 or args.windows < 1 or args.timeout < 1:
        p.error("--warmup must be >= 0, --windows and --timeout >= 1")
    return args


def child_environment():
    """Sets this process's environment to what every child must see (run_logged passes it on)."""
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    os.environ.update(CHILD_ENV)


def command(args, impl, world, b, k):
    torchrun = shlex.split(args.torchrun) + ["--standalone", f"--nproc-per-node={world}"]
    if impl == "accrue":
        # gpt2_bench's command with K x world: --total-batch-tokens B x K x T x world,
        # which the trainer divides by B x T x world size back into K.
        cmd = accrue_cmd(args, "d12", b, k * world, args.warmup, args.windows)
        return cmd if world == 1 else torchrun + ["--no-python"] + cmd
    cmd = torch_cmd(args, "d12", b, k, compile_=False)  # [python, torch_gpt2.py, ...]
    return cmd if world == 1 else torchrun + cmd[1:]


def why_failed(text, trainer="accrue_train_gpt2"):
    """The line of a failed run's output that says why: the last error of the trainer or of
    a Python exception (not torchrun's ChildFailedError), else the last line with a letter."""
    lines = [line.strip() for line in text.splitlines() if any(c.isalpha() for c in line)]
    errors = [line for line in lines if "ChildFailedError" not in line and (
        line.startswith(f"{trainer}:") or re.match(r"[\w.]*(Error|Exception)\b", line))]
    found = errors or lines
    return found[-1][:200] if found else ""


def run_and_read(cmd, timeout, log_dir, tag, row, world, may_retry, limit, trainer, prefix):
    """Runs cmd (once more when a 2-GPU accrue run found its exchange port taken, may_retry),
    fills row from its JSON line and row["error"] with why it failed, if it did; returns the
    run's seconds. limit: the timeout a message names."""
    for attempt in (1, 2):
        status, out, err, seconds = run_logged(cmd, timeout, log_dir,
                                               tag if attempt == 1 else f"{tag}_retry")
        if not (may_retry and world > 1 and attempt == 1 and PORT_TAKEN in out + err):
            break
        print(f"[{prefix}] {tag}: the exchange port was taken; once more", flush=True)
    raw = last_json_line(out) or {}
    row.update(seconds=round(seconds, 1), exit=status, raw=raw)
    row.update(normalize(raw))
    reported_world = raw.get("world_size")
    # timeout(1) exits 124 after its SIGTERM, 137 when it had to SIGKILL.
    if status is None or (world > 1 and status in (124, 137)):
        row["error"] = f"timed out after {limit} s"
    elif raw.get("error"):
        row["error"] = str(raw["error"])
    elif "out of memory" in (out + err).lower() and row["tokens_per_s"] is None:
        row["error"] = "out of memory"
    elif status != 0 or row["tokens_per_s"] is None:
        why = why_failed(err, trainer) or why_failed(out, trainer) or "no output"
        row["error"] = f"exit {status}: {why}"
    elif reported_world is not None and reported_world != world:
        row["error"] = f"ran as world size {reported_world}, not {world}"
    return seconds


def run_one(args, impl, world, b, k, label):
    """One run; returns its row (errors are rows too), or None under --dry-run."""
    tag = f"{impl}_{world}gpu_{b}x{k}"
    cmd = command(args, impl, world, b, k)
    if world > 1:
        # On a timeout torchrun gets SIGTERM and stops its workers itself (they
        # run in their own sessions: killing torchrun alone would orphan them).
        cmd = ["timeout", "--kill-after=60", str(args.timeout)] + cmd
    print(f"[gpt2_dp_bench] {tag}: {shlex.join(cmd)}", flush=True)
    if args.dry_run:
        return None
    row = {"impl": impl, "label": label, "world_size": world, "micro_batch": b, "K": k,
           "cmd": cmd}
    seconds = run_and_read(cmd, args.timeout + 90, args.log_dir, tag, row, world,
                           impl == "accrue", args.timeout, "accrue_train_gpt2", "gpt2_dp_bench")
    if ok(row):
        peak = row["peak_mem_gib"]
        print(f"[gpt2_dp_bench] {tag}: {row['tokens_per_s']:,.0f} tokens/s, peak "
              f"{peak if peak is not None else float('nan'):.2f} GiB ({seconds:.0f} s)",
              flush=True)
    else:
        print(f"[gpt2_dp_bench] {tag}: {row['error']} ({seconds:.0f} s)", flush=True)
    return row


# ---- tables ----------------------------------------------------------------------------------

def ratio(a, b):
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if ok(a) and ok(b) else "–"


def tables(rows, args, gpu):
    by = {(r["impl"], r["world_size"], r["micro_batch"], r["K"]): r for r in rows}
    n = args.nproc
    lines = [
        f"GPT-2 d12, bf16, {SEQ_LEN}-token sequences, {n} GPUs beside 1, on {gpu}: each GPU "
        f"trains B x K sequences per window (accrue 2 GPUs: --total-batch-tokens "
        f"B x K x {SEQ_LEN} x {n}); tokens/s over all GPUs",
        "",
        f"| B x K | accrue 1 GPU tok/s | accrue {n} GPUs tok/s | accrue {n}/1 "
        f"| PyTorch 1 GPU tok/s | PyTorch DDP {n} GPUs tok/s | DDP {n}/1 "
        f"| accrue {n} GPUs / DDP | DDP no_sync 2 x H200 ref tok/s | accrue {n} GPUs / ref |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b, k in args.points:
        a1, an = by.get(("accrue", 1, b, k)), by.get(("accrue", n, b, k))
        t1, tn = by.get(("torch", 1, b, k)), by.get(("torch_ddp", n, b, k))
        ref = DDP_NO_SYNC_2XH200.get((b, k)) if n == 2 else None
        vs_ref = f"{an['tokens_per_s'] / ref:.2f}x" if ok(an) and ref else "–"
        lines.append(f"| {b} x {k} | {fmt_rate(a1)} | {fmt_rate(an)} | {ratio(an, a1)} "
                     f"| {fmt_rate(t1)} | {fmt_rate(tn)} | {ratio(tn, t1)} | {ratio(an, tn)} "
                     f"| {fmt(ref, ',')} | {vs_ref} |")
    lines += ["", "Peak memory per GPU, GiB (2-GPU runs: the largest over ranks for PyTorch, "
                  "rank 0's for accrue)", "",
              f"| B x K | accrue 1 GPU | accrue {n} GPUs | PyTorch 1 GPU | PyTorch DDP {n} GPUs |",
              "|---|---:|---:|---:|---:|"]
    for b, k in args.points:
        cells = [fmt((by.get(key + (b, k)) or {}).get("peak_mem_gib"), ".2f")
                 for key in (("accrue", 1), ("accrue", n), ("torch", 1), ("torch_ddp", n))]
        lines.append(f"| {b} x {k} | " + " | ".join(cells) + " |")
    # accrue_train_gpt2 --bench under data parallelism reports rank 0's last window
    # (dist::ReducerTiming): the last backward with the buckets under it, and what the
    # close still waited for.
    timed = [(b, k, (by.get(("accrue", n, b, k)) or {}).get("raw") or {}) for b, k in args.points]
    timed = [(b, k, raw) for b, k, raw in timed if "reducer_last_backward_ms" in raw]
    if timed:
        lines += ["", f"accrue {n} GPUs, rank 0's last window: "
                  + "; ".join(f"{b} x {k}: last backward {raw['reducer_last_backward_ms']:.2f} ms, "
                              f"the close waited {raw['reducer_close_waited_ms']:.3f} ms"
                              for b, k, raw in timed)]
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += [""] + [f"{r['label']} at {r['micro_batch']} x {r['K']}: {r['error']}"
                         for r in failed]
    refs_gpu = "" if "H200" in gpu else " (this machine's GPUs are not H200s)"
    lines += ["", f"The ratios compare runs on this machine; the DDP no_sync reference is a "
                  f"fixed figure from 2 x H200{refs_gpu}."]
    return lines


def main():
    args = parse_args()
    child_environment()
    gpu = "(dry run)" if args.dry_run else gpu_name()
    if not args.dry_run and not os.access(args.accrue_bin, os.X_OK):
        print(f"[gpt2_dp_bench] warning: {args.accrue_bin} is not an executable; its runs will "
              f"fail (--accrue-bin)", flush=True)
    rows = []
    for b, k in args.points:
        for impl, world, label in RUNS:
            if impl != "accrue" and args.skip_torch:
                continue
            world = args.nproc if world > 1 else 1
            label = label.replace("2 GPUs", f"{world} GPUs")
            row = run_one(args, impl, world, b, k, label)
            if row is not None:
                rows.append(row)

    text = "\n".join(tables(rows, args, gpu))
    print("\n" + text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.dry_run:
        return 0
    accrue_rows = [r for r in rows if r["impl"] == "accrue"]
    return 0 if accrue_rows and all(ok(r) for r in accrue_rows) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch DDP counterpart of `accrue_bench_dist --mode scaling`: same model, shapes, timing, keys.

    torchrun --standalone --nproc-per-node=1 bench/torch_ddp.py --json torch_ddp_1gpu.json
    torchrun --standalone --nproc-per-node=2 bench/torch_ddp.py --json torch_ddp_2gpu.json

The model is accrue's nn::MLP({in, width x depth, classes}) layer for layer: an
nn.Sequential of Linear(in, width), GELU(tanh), ..., Linear(width, classes). Dtype
policy as accrue's: f32 parameters (accrue: f32 master weights), bf16 compute
through torch.autocast (accrue: a bf16 compute copy the optimizer writes). One
window of K micro-batches of B items:

    for k in range(K):
        with ddp.no_sync() if k < K - 1 else nullcontext():    # only the last one syncs
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y, reduction="sum")
            (loss / (K * B)).backward()     # item-count normalization; DDP averages ranks
    clip_grad_norm_(params, 1.0)            # foreach
    opt.step()                              # AdamW(fused=True), betas 0.9/0.95, wd 0.1
    opt.zero_grad(set_to_none=...)

DDP: bucket_cap_mb=25 (first bucket 1 MiB, DDP's default, as accrue's),
gradient_as_bucket_view=True, and zero_grad(set_to_none=False) so that the
gradients stay views of the buckets (set_to_none would drop the views and the
memory they save). At world size 1 the model is not wrapped (accrue has no
reducer there either) and zero_grad sets gradients to None, PyTorch's default.

Timing follows Note [Window timing] in bench/bench_dist.cpp: nothing in the loop
synchronizes the host, a CUDA event after each window marks its end, the
window time is the median gap between marks after the warm-up (max over
ranks), throughput is the items of a window over all ranks divided by it, and
peak memory is torch.cuda.max_memory_allocated from after setup (max over
ranks). The rows carry accrue's keys; bench/compare_dist.py pairs them.

All-reduces per window: by default the number of DDP buckets (DDP reduces each
bucket once per synchronized backward), read from DDP's logging data;
--count-allreduces hook counts the calls instead, with a Python communication
hook that wraps DDP's default allreduce hook (a little host overhead per bucket).
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="rank 0 writes the results here")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6, help="Linear+GELU layers of --width")
    p.add_argument("--in", dest="in_features", type=int, default=4096)
    p.add_argument("--classes", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"],
                   help="autocast dtype (f32: no autocast); parameters are f32")
    p.add_argument("--micro-batch", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=16384)
    p.add_argument("--k", default="1,4,8", help="micro-steps per window, comma-separated")
    p.add_argument("--tables", default="fixed_micro,fixed_global")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--count-allreduces", choices=["buckets", "hook"], default="buckets")
    p.add_argument("--bf16-compress", action="store_true",
                   help="buckets travel in bf16 (DDP's bf16_compress_hook); rows are named "
                        "ddp_bf16, the twin of accrue's ddp_bf16 variant")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU with gloo: checks this script without a GPU "
                        "(use tiny sizes; the timings and memory mean nothing)")
    args = p.parse_args()
    args.ks = [int(k) for k in args.k.split(",") if k]
    args.tables = [t for t in args.tables.split(",") if t]
    for t in args.tables:
        if t not in ("fixed_micro", "fixed_global"):
            p.error(f"unknown table {t!r} (fixed_micro, fixed_global)")
    if args.windows < 1 or any(k < 1 for k in args.ks):
        p.error("--windows and every K must be >= 1")
    return args


def mlp(args):
    widths = [args.in_features] + [args.width] * args.depth + [args.classes]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.GELU(approximate="tanh"))  # accrue's GELU is the tanh form
    return nn.Sequential(*layers)


class HostEvent:
    """torch.cuda.Event's timing interface on the host clock, for --cpu."""

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def max_over_ranks(values, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def ddp_bucket_count(ddp):
    """DDP's bucket count from its logging data (rebuilt buckets once known), else None."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # a private interface: absent or changed in this PyTorch
        return None
    for key in ("rebuilt_bucket_sizes", "bucket_sizes"):
        sizes = [s for s in str(data.get(key, "")).split(",") if s.strip()]
        if sizes:
            return len(sizes)
    return None


def run_row(args, table, k, micro, world, rank, device):
    torch.manual_seed(1234)
    model = mlp(args).to(device)
    ddp = None
    counter = [0]
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=None if args.cpu else [device.index],
            bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.bf16_compress_hook if args.bf16_compress else None
        if args.count_allreduces == "hook":
            inner = hook or default_hooks.allreduce_hook

            def counting_allreduce(state, bucket):
                counter[0] += 1
                return inner(state, bucket)

            hook = counting_allreduce
        if hook is not None:
            ddp.register_comm_hook(None, hook)

    net = ddp if ddp is not None else model
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    set_to_none = ddp is None
    autocast_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": None}[args.dtype]
    input_dtype = autocast_dtype or torch.float32

    gen = torch.Generator(device=device)
    gen.manual_seed(1000 + rank)
    batches = [(torch.randn(micro, args.in_features, device=device, generator=gen,
                            dtype=torch.float32).to(input_dtype),
                torch.randint(0, args.classes, (micro,), device=device, generator=gen))
               for _ in range(2)]
    inv_items = 1.0 / (k * micro)

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    losses = []

    def run_window():
        total = None
        for step in range(k):
            x, y = batches[step % len(batches)]
            sync = ddp is None or step == k - 1
            with (contextlib.nullcontext() if sync else ddp.no_sync()):
                with autocast():
                    loss = F.cross_entropy(net(x), y, reduction="sum")
                (loss * inv_items).backward()
            total = loss.detach() if total is None else total + loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(total)

    stream = None if args.cpu else torch.cuda.current_stream(device)
    if not args.cpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        run_window()
    marks = [HostEvent() if args.cpu else torch.cuda.Event(enable_timing=True)
             for _ in range(args.windows + 1)]
    counted_before = counter[0]
    marks[0].record(stream)
    for w in range(args.windows):
        run_window()
        marks[w + 1].record(stream)
    marks[-1].synchronize()
    window_ms = [marks[w].elapsed_time(marks[w + 1]) for w in range(args.windows)]
    loss = losses[-1].item() * inv_items
    if loss != loss or abs(loss) == float("inf"):
        raise RuntimeError(f"torch_ddp: training went wrong (loss {loss})")

    if ddp is None:
        allreduces, buckets = 0.0, 0
    else:
        buckets = ddp_bucket_count(ddp)
        if args.count_allreduces == "hook":
            allreduces = (counter[0] - counted_before) / args.windows
        else:
            allreduces = float(buckets) if buckets is not None else None
    peak = 0.0 if args.cpu else float(torch.cuda.max_memory_allocated(device))
    worst = max_over_ranks([statistics.median(window_ms), peak], device)
    items = k * micro * world
    return {
        "table": table, "variant": "ddp_bf16" if args.bf16_compress else "ddp", "world_size": world, "K": k, "micro_batch": micro,
        "items_per_window": items, "window_ms": worst[0], "items_per_s": items / (worst[0] * 1e-3),
        "allreduces_per_window": allreduces, "buckets": buckets,
        "peak_mem_MB": worst[1] / 1e6, "loss": loss,
    }


def main():
    args = parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("torch_ddp: no CUDA device", file=sys.stderr)
        return 1
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        device = torch.device("cpu")
        if world > 1:
            dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if world > 1:
            dist.init_process_group("nccl", device_id=device)
    # accrue accumulates bf16 products in fp32 (as torch_bench.py sets for its matmuls).
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_tf32 = False

    params = sum(p.numel() for p in mlp(args).parameters())
    device_name = "cpu" if args.cpu else torch.cuda.get_device_name(device)
    if rank == 0:
        print(f"torch_ddp: MLP {args.width} x {args.depth} (+ {args.in_features} -> "
              f"{args.classes}), {params / 1e6:.1f}M parameters, {args.dtype} autocast, "
              f"{world} rank(s) on {device_name}, torch {torch.__version__}")
        print(f"{'table':<13} {'K':>3} {'micro':>6} {'items/w':>8} {'window_ms':>11} "
              f"{'items/s':>12} {'allreduce/w':>11} {'peak_MB':>11}", flush=True)
    rows = []
    for table in args.tables:
        for k in args.ks:
            micro = args.micro_batch
            if table == "fixed_global":
                if args.global_batch % (k * world):
                    raise SystemExit(f"torch_ddp: --global-batch {args.global_batch} is not "
                                     f"divisible by K x world = {k} x {world}")
                micro = args.global_batch // (k * world)
            row = run_row(args, table, k, micro, world, rank, device)
            rows.append(row)
            if rank == 0:
                ar = row["allreduces_per_window"]
                print(f"{table:<13} {k:>3} {micro:>6} {row['items_per_window']:>8} "
                      f"{row['window_ms']:>11.3f} {row['items_per_s']:>12.0f} "
                      f"{'?' if ar is None else f'{ar:.2f}':>11} {row['peak_mem_MB']:>11.1f}",
                      flush=True)
            gc.collect()  # the row's DDP reducer holds reference cycles
            if not args.cpu:
                torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "torch", "mode": "scaling", "world_size": world,
                       "device": device_name, "torch": torch.__version__,
                       "model": "mlp", "width": args.width, "depth": args.depth,
                       "in": args.in_features, "classes": args.classes, "params": params,
                       "compute_dtype": args.dtype, "warmup": args.warmup,
                       "windows": args.windows, "count_allreduces": args.count_allreduces,
                       "rows": rows}, f, indent=1)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

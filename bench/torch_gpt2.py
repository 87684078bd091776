#!/usr/bin/env python3
"""PyTorch GPT-2 training throughput, the counterpart of `accrue_train_gpt2 --bench`.

    python3 bench/torch_gpt2.py --micro-batch 16 --k 2            # eager
    python3 bench/torch_gpt2.py --micro-batch 16 --k 2 --compile  # torch.compile
    torchrun --standalone --nproc-per-node=2 bench/torch_gpt2.py --micro-batch 8 --k 4  # DDP
    python3 bench/torch_gpt2.py --micro-batch 8 --k 4 --accrue-bridge  # accrue.torch's window

GPT-2 as llm.c's PyTorch reference trains it: GPT-2 124M (d12; --model d24,
d36, d48 for the larger ones), the vocabulary padded to 50304 (wte [50304, C],
tied with the output layer; the logits and the softmax span all 50304
columns, as there), fp32 parameters under torch.autocast(bfloat16),
F.scaled_dot_product_attention(is_causal=True) (flash attention), GELU tanh,
AdamW(fused=True, lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
the 2-D weights, 0 on the rest), clip_grad_norm_(1.0). One window of K
micro-batches of B sequences of T = 1024 tokens (B x K = 32 by default: 32,768
tokens per optimizer step):

    for k in range(K):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x_k, y_k)                    # summed cross-entropy
        (loss / (K * B * T)).backward()               # the window's token mean
    clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)

--accrue-bridge trains the same model (the same fp32 parameters under the same
autocast) through accrue.torch.AccumulationWindow instead (python/accrue/torch.py,
Note [Torch bridge]): the window moves the parameters into accrue's arenas (each
parameter's .data and .grad become views of its slots), and its close is
accrue's fused one, with AdamW's hyper-parameters and weight-decay groups as
above and the norm clipped at 1.0:

    window = AccumulationWindow(model, "adamw", lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                                param_groups=[decay 0.1, no decay], micro_steps=K,
                                max_grad_norm=1.0)
    for k in range(K):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum = model(x_k, y_k)                # summed cross-entropy
        window.backward(loss_sum, B * T)              # the micro-batch's tokens
    window.close()                                    # divides by N = K B T once

With --cuda-graphs the first window runs eagerly and the others replay it
from a torch.cuda.CUDAGraph (window.capture(graph) around the loop above,
then window.replay(graph); one GPU; close_ms_median is then null).
The window zeroes its gradient arena at micro-step 0 (zero_grad's work).
--compile compiles the model after the window is built (the window's hooks
are on the parameters, outside the compiled graph). window.report() reads the device
back, so it runs only after the timing (for the last window's loss).

Tokens are random (uniform over the 50257 real ids, drawn once on the GPU:
the data pipeline is not timed). Timing: `--warmup` windows (torch.compile
compiles there), then `--windows` windows marked by CUDA events on the current
stream with nothing synchronizing the host between them; the window time is
the median gap, tokens/s = tokens per window / that median. Peak memory is
torch.cuda.max_memory_allocated over the warm-up and timed windows (weights,
gradients, optimizer state and activations). MFU counts model FLOPs per
token as 6 N + 12 L C T (N: parameters minus wpe and wte's padded rows; the
second term the attention score and value products; PaLM's appendix B), as
accrue_train_gpt2 counts them, against the GPU's
dense bf16 peak (`peak_tflops` below, or --peak-tflops). Under --accrue-bridge
the arenas (master weights, gradients, AdamW's moments) come from accrue's
allocator, which torch's figure does not see: peak memory is torch's peak
plus the arenas' bytes (fixed from construction on; accrue's scratch for the
close is not counted).

The close (clip_grad_norm_, opt.step and zero_grad; or window.close()) is
marked by two more CUDA events each window, read after the timing like the
others: its median over the timed windows is close_ms_median. It is the gap
on the stream, so it includes the time the host takes to launch the close
when the GPU waits for it.

Data parallelism: launched by torchrun with WORLD_SIZE > 1, each rank drives
GPU LOCAL_RANK in an NCCL process group and trains the model wrapped in
DistributedDataParallel (bucket_cap_mb 25, --bucket-cap-mb; first bucket 1
MiB, DDP's default; gradient_as_bucket_view=True), each rank on its own
random tokens. Every rank runs the window above on its own B x K x T tokens
(the per-GPU batch; the global batch is world size times that), with the
first K - 1 micro-steps under model.no_sync() so that only the last backward
all-reduces the buckets (DDP averages over ranks: the loss stays the global
token mean), and zero_grad(set_to_none=False), which keeps the gradients
views of the buckets (as bench/torch_ddp.py does). The window time is the
median over the timed windows, the largest over ranks; tokens/s counts the
tokens of ALL ranks; peak memory is the largest over ranks; MFU is per GPU.
With --accrue-bridge there is no DDP: the window gets the process group
(torch.distributed.group.WORLD), and its own reducer, on an NCCL communicator
of accrue's, all-reduces each bucket as its gradients land in the last
micro-step's backward and the rest in the close, N summed over the ranks (the
loss the global token mean); so under torchrun close_ms_median includes the
buckets left for the close, where DDP's are all in the last backward.
Only rank 0 prints the JSON line (with "world_size"); a rank that runs out
of memory prints its own error line.

Prints ONE JSON line (bench/gpt2_bench.py and bench/gpt2_dp_bench.py read
it): mode (eager or compile), recipe ("torch", or "accrue_bridge" for
--accrue-bridge), model,
world_size, micro_batch, K, seq_len, tokens_per_window (all ranks),
tokens_per_s (all ranks), window_ms, window_ms_min, peak_mem_gib,
accrue_arena_gib (the bridge's arenas, in peak_mem_gib; null otherwise),
close_ms_median, cuda_graphs, mfu, loss (the last window's token mean), gpu, torch,
params; on out-of-memory (torch's or accrue's allocator) the same line with
"error": "out of memory" (exit status 3).

--composed runs the same model written without fused ops, the counterpart of
`accrue_train_gpt2 --composed` (examples/composed_gpt2): q, k and v split into
heads by view + permute + contiguous, attention as (q @ k^T) * scale + a
causal mask buffer, softmax, @ v, the heads merged by permute + contiguous,
and the logits of the 50257 real columns only (wte narrowed, as accrue's
composed model does) before F.cross_entropy.

--fp8 runs each block's four projections as FP8 GEMMs (bench/torch_fp8.py,
torch._scaled_mm with per-tensor current scaling, the weights cast at every
micro-batch), the counterpart of `accrue_train --fp8`.

--cpu runs a tiny model on the CPU with host timing (gloo under torchrun), to
check this script without a GPU (the numbers mean nothing); --accrue-bridge
runs there on one process (accrue's CPU build), not under torchrun (NCCL).
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

# (n_layer, n_head, n_embd) of the GPT-2 sizes; "tiny" is for --cpu checks.
MODELS = {
    "d12": (12, 12, 768),
    "d24": (24, 16, 1024),
    "d36": (36, 20, 1280),
    "d48": (48, 25, 1600),
    "tiny": (2, 4, 64),
}
VOCAB = 50257
PADDED_VOCAB = 50304
TINY_VOCAB = 512  # --model tiny: vocabulary (unpadded) for --cpu checks

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a substring of the
# GPU's name; the first match wins.
# H100/H200 as accrue_train_gpt2 takes them.
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("H200", 989.0),
               ("H100", 989.0), ("H800", 989.0), ("B200", 2250.0), ("A100", 312.0)]


def peak_tflops(gpu_name):
    """The dense bf16 peak of the named GPU, or None when unknown."""
    for key, value in PEAK_TFLOPS:
        if key in gpu_name:
            return value
    return None


def vocab_sizes(model):
    return (TINY_VOCAB, TINY_VOCAB) if model == "tiny" else (VOCAB, PADDED_VOCAB)


def parameter_count(model, block_size):
    """GPT-2's parameters: wte (padded), wpe, per layer 12 C^2 + 13 C, ln_f."""
    L, _, C = MODELS[model]
    _, padded = vocab_sizes(model)
    return padded * C + block_size * C + L * (12 * C * C + 13 * C) + 2 * C


def flops_per_token(model, seq_len, block_size):
    """Training FLOPs per token, as accrue_train_gpt2 counts them: 6 N + 12 L C T, N
    without wpe (a lookup, no matmul) and without wte's padded rows."""
    L, _, C = MODELS[model]
    vocab, padded = vocab_sizes(model)
    n = parameter_count(model, block_size) - block_size * C - (padded - vocab) * C
    return 6 * n + 12 * L * C * seq_len


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="d12", choices=sorted(MODELS))
    p.add_argument("--micro-batch", type=int, default=16, help="B: sequences per micro-batch")
    p.add_argument("--k", type=int, default=None,
                   help="K: micro-batches per window (default: --global-batch / B)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per window")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--fp8", action="store_true",
                   help="each block's four projections in FP8 (bench/torch_fp8.py: "
                        "torch._scaled_mm, e4m3 / e5m2, current scaling), the twin of "
                        "accrue_train --fp8")
    p.add_argument("--composed", action="store_true",
                   help="attention and heads from plain ops, no SDPA (see above)")
    p.add_argument("--accrue-bridge", action="store_true",
                   help="train through accrue.torch.AccumulationWindow instead of "
                        "torch.optim.AdamW (and DDP under torchrun); see above")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="with --accrue-bridge: each window after the first replayed from a "
                        "torch.cuda.CUDAGraph (AccumulationWindow.capture / replay)")
    p.add_argument("--warmup", type=int, default=3, help="untimed windows first")
    p.add_argument("--windows", type=int, default=10, help="timed windows")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP's bucket size under torchrun with WORLD_SIZE > 1")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak for MFU (default: from its name)")
    p.add_argument("--json", help="also write the JSON line to this file")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU (use --model tiny): checks this script without a GPU")
    args = p.parse_args()
    if args.k is None:
        if args.global_batch % args.micro_batch != 0:
            p.error(f"--global-batch {args.global_batch} is not a multiple of --micro-batch "
                    f"{args.micro_batch}")
        args.k = args.global_batch // args.micro_batch
    if args.micro_batch < 1 or args.k < 1 or args.windows < 1 or args.warmup < 0:
        p.error("--micro-batch, --k and --windows must be >= 1, --warmup >= 0")
    if args.seq_len < 1 or args.seq_len > 1024:
        p.error(f"--seq-len {args.seq_len}: GPT-2's context is 1 to 1024")
    if args.bucket_cap_mb <= 0:
        p.error(f"--bucket-cap-mb {args.bucket_cap_mb} must be positive")
    if args.cuda_graphs and (not args.accrue_bridge or args.cpu or launch_env()[0] > 1):
        p.error("--cuda-graphs is the bridge's (--accrue-bridge), on one CUDA device (a "
                "window's all-reduces launch from host hooks, which a replay does not run)")
    if args.accrue_bridge and args.cpu and launch_env()[0] > 1:
        p.error("--accrue-bridge under torchrun needs CUDA: the bridge all-reduces over NCCL")
    return args


def launch_env():
    """(world size, rank, local rank) from torchrun's variables; (1, 0, 0) without them."""
    return (int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
            int(os.environ.get("LOCAL_RANK", "0")))


def max_over_ranks(torch, values, device):
    """Each value's largest over the ranks (the values themselves on one process)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def build_model(torch, args):
    import torch.nn.functional as F
    from torch import nn

    L, H, C = MODELS[args.model]
    vocab, padded = vocab_sizes(args.model)
    block_size = 1024

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x, mask):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            if args.composed:
                q, k, v = (t.view(B, T, H, C // H).permute(0, 2, 1, 3).contiguous()
                           for t in (q, k, v))
                scores = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(C // H))
                y = torch.softmax(scores + mask[:T, :T], dim=3) @ v
                y = y.permute(0, 2, 1, 3).contiguous().view(B, T, C)
            else:
                q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(padded, C)
            self.wpe = nn.Embedding(block_size, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, padded, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            if args.composed:  # the causal mask, added to the scores
                self.register_buffer("mask", torch.full((block_size, block_size), -math.inf)
                                     .triu(1), persistent=False)
            else:
                self.mask = None
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):  # residual projections, as GPT-2
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
                elif p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe.weight[:T]
            for block in self.h:
                x = block(x, self.mask)
            if args.composed:  # the real columns only, as examples/composed_gpt2
                logits = self.ln_f(x) @ self.wte.weight[:vocab].t()
                return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1),
                                       reduction="sum")
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, padded), targets.reshape(-1), reduction="sum")

    model = GPT()
    assert sum(p.numel() for p in model.parameters()) == parameter_count(args.model, block_size)
    return model, vocab


class HostEvent:
    """torch.cuda.Event's timing interface on the host clock, for --cpu."""

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def time_windows(torch, args, device, window):
    """args.warmup untimed calls of window(), then args.windows timed ones (CUDA events on the
    stream, or the host clock on the CPU), peak memory counted from before the warm-up; the
    windows' times in ms."""
    stream = None if args.cpu else torch.cuda.current_stream(device)
    if not args.cpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        window()
    marks = [HostEvent() if args.cpu else torch.cuda.Event(enable_timing=True)
             for _ in range(args.windows + 1)]
    marks[0].record(stream)
    for w in range(args.windows):
        window()
        marks[w + 1].record(stream)
    marks[-1].synchronize()
    return [marks[w].elapsed_time(marks[w + 1]) for w in range(args.windows)]


def rank_figures(torch, args, device, window_ms, tokens_per_window, world, outside_bytes=0):
    """The figures both PyTorch benchmarks report, the slowest rank's (the ranks wait for each
    other at every all-reduce): median and fastest window ms, peak memory bytes (0 on the CPU,
    which has no allocator figure; outside_bytes, memory held outside torch's allocator all
    along, added), tokens per window and per second over all ranks, the GPU's name and its
    dense bf16 peak in TFLOP/s (None when unknown)."""
    peak_bytes = 0.0 if args.cpu else float(torch.cuda.max_memory_allocated(device)
                                            + outside_bytes)
    median_ms, min_ms, peak_bytes = max_over_ranks(
        torch, [statistics.median(window_ms), min(window_ms), peak_bytes], device)
    all_tokens = tokens_per_window * world
    gpu = "cpu" if args.cpu else torch.cuda.get_device_name(device)
    return dict(median_ms=median_ms, min_ms=min_ms, peak_bytes=peak_bytes, all_tokens=all_tokens,
                tokens_per_s=all_tokens / (median_ms / 1e3), gpu=gpu,
                peak=args.peak_tflops or (None if args.cpu else peak_tflops(gpu)))


def decay_groups(model):
    """AdamW's parameter groups of llm.c's recipe: weight decay 0.1 on the 2-D weights, 0 on
    the rest (biases, norms)."""
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def random_batches(torch, args, device, vocab, rank):
    """A few random micro-batches, each rank its own, reused (fresh data each micro-step would
    time the draw)."""
    B, K, T = args.micro_batch, args.k, args.seq_len
    gen = torch.Generator(device=device)
    gen.manual_seed(2024 + rank)
    batches = []
    for _ in range(min(K, 4)):
        seq = torch.randint(0, vocab, (B, T + 1), device=device, generator=gen)
        batches.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return batches


def training_setup(torch, args, model, world, rank, device, vocab, wrap_ddp=True):
    """What the PyTorch benchmarks train with: fused AdamW (weight decay on 2-D weights only),
    DDP under torchrun (unless wrap_ddp is False: FSDP2 has wrapped the model itself),
    torch.compile when asked, and random_batches. Returns (opt, ddp or None, step_model,
    batches)."""
    opt = torch.optim.AdamW(decay_groups(model), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=not args.cpu)
    ddp = None
    if world > 1 and wrap_ddp:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=None if args.cpu else [device.index],
            bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
    net = ddp if ddp is not None else model
    step_model = torch.compile(net) if args.compile else net
    return opt, ddp, step_model, random_batches(torch, args, device, vocab, rank)


def torch_recipe(torch, args, model, world, rank, device, vocab, autocast, timed_close):
    """The usual PyTorch recipe (the first loop above). Returns (window, the last window's
    loss per token, parallel, bytes outside torch's allocator)."""
    opt, ddp, step_model, batches = training_setup(torch, args, model, world, rank, device,
                                                   vocab)
    # Under DDP the gradients stay views of the buckets (set_to_none would drop them).
    set_to_none = ddp is None
    B, K, T = args.micro_batch, args.k, args.seq_len
    # This rank's token mean; DDP averages the ranks' gradients: the global mean.
    inv_tokens = 1.0 / (B * K * T)
    losses = []

    def close():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    def window():
        total = None
        for k in range(K):
            x, y = batches[k % len(batches)]
            # Only the window's last backward all-reduces (DDP's no_sync before it).
            sync = ddp is None or k == K - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                with autocast():
                    loss = step_model(x, y)
                (loss * inv_tokens).backward()
            total = loss.detach() if total is None else total + loss.detach()
        timed_close(close)
        losses.append(total)

    return (window, lambda: float(losses[-1]) * inv_tokens,
            "ddp no_sync" if ddp is not None else "none", 0)


def arena_bytes(store):
    """The bytes of an accrue ParamStore's arenas (master, gradients, compute copy, AdamW's two
    moments): accrue allocates them, so torch.cuda.max_memory_allocated does not see them."""
    arenas = [store.master, store.grads, store.moment(0), store.moment(1)]
    if store.compute is not None:
        arenas.append(store.compute)
    return sum(t.numel() * t.element_size() for t in arenas)


def bridge_recipe(torch, args, model, world, rank, device, vocab, autocast, timed_close):
    """The same training through accrue.torch.AccumulationWindow (the second loop above).
    Returns what torch_recipe does."""
    import torch.distributed as dist
    from accrue.torch import AccumulationWindow

    B, K, T = args.micro_batch, args.k, args.seq_len
    # torch.optim.AdamW's hyper-parameters and groups; no DDP: under torchrun the window's own
    # reducer sums the gradients and N over the group at the last micro-step and the close.
    win = AccumulationWindow(model, "adamw", lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.1, param_groups=decay_groups(model),
                             micro_steps=K, max_grad_norm=1.0,
                             process_group=dist.group.WORLD if world > 1 else None)
    # Compiled after the window has moved the parameters into its arenas (their .data).
    step_model = torch.compile(model) if args.compile else model
    batches = random_batches(torch, args, device, vocab, rank)
    graph = None

    def micro_steps():
        for k in range(K):
            x, y = batches[k % len(batches)]
            with autocast():
                loss_sum = step_model(x, y)
            win.backward(loss_sum, B * T)  # the close divides by the window's N

    def window():
        nonlocal graph
        if not args.cuda_graphs or win.windows_closed == 0:
            micro_steps()  # eager (the graph's warm-up: workspaces, plans, the count's tensor)
            timed_close(win.close)
            return
        if graph is None:  # the batches are the same tensors every window: the static inputs
            graph = torch.cuda.CUDAGraph()
            with win.capture(graph):
                micro_steps()
                win.close()
        win.replay(graph)  # the whole window: no close of its own to time

    # report() reads the device back: only after the timing. Its loss is sum / N, the
    # window's token mean (over all ranks).
    return (window, lambda: win.report().loss, "accrue reducer" if world > 1 else "none",
            arena_bytes(win.store))


def run(torch, args, world, rank, device):
    torch.manual_seed(1234)  # every rank the same weights (DDP broadcasts rank 0's anyway)
    model, vocab = build_model(torch, args)
    if args.fp8:
        from torch_fp8 import convert_to_fp8

        projections = ("c_attn", "attn_proj", "c_fc", "mlp_proj")
        convert_to_fp8(model, lambda name, layer: name.endswith(projections))
    model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    B, K, T = args.micro_batch, args.k, args.seq_len
    tokens_per_window = B * K * T  # this rank's

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16)

    closes = []  # (start, end) marks around each window's close, the warm-up's too

    def timed_close(close):
        # Marks on the stream, read after the timing: nothing syncs the host here.
        start, end = (HostEvent() if args.cpu else torch.cuda.Event(enable_timing=True)
                      for _ in range(2))
        start.record()
        close()
        end.record()
        closes.append((start, end))

    recipe, accrue_oom = torch_recipe, ()
    if args.accrue_bridge:
        import accrue

        recipe, accrue_oom = bridge_recipe, accrue.OutOfMemoryError
    try:
        window, last_loss, parallel, outside_bytes = recipe(
            torch, args, model, world, rank, device, vocab, autocast, timed_close)
        window_ms = time_windows(torch, args, device, window)
        loss = last_loss()
    except accrue_oom as e:  # accrue's allocator ran out: reported as torch's out of memory
        raise torch.cuda.OutOfMemoryError(str(e)) from e
    if not math.isfinite(loss):
        raise RuntimeError(f"the last window's loss is {loss}")
    # The timed windows' closes (time_windows has waited for the last window's mark).
    # (None under --cuda-graphs: a replayed window has no close of its own.)
    close_ms = [start.elapsed_time(end) for start, end in closes[-args.windows:]]
    close_median = (max_over_ranks(torch, [statistics.median(close_ms)], device)[0]
                    if len(close_ms) == args.windows else None)

    f = rank_figures(torch, args, device, window_ms, tokens_per_window, world, outside_bytes)
    median_ms, min_ms, peak_bytes, all_tokens = f["median_ms"], f["min_ms"], f["peak_bytes"], \
        f["all_tokens"]
    tokens_per_s, gpu, peak = f["tokens_per_s"], f["gpu"], f["peak"]
    mfu = None
    if peak:  # per GPU
        mfu = tokens_per_s * flops_per_token(args.model, T, 1024) / (peak * 1e12 * world)
    return {
        "impl": "pytorch",
        "mode": "compile" if args.compile else "eager",
        "recipe": "accrue_bridge" if args.accrue_bridge else "torch",
        "compile": args.compile,
        "composed": args.composed,
        "fp8": args.fp8,
        "model": args.model,
        "world_size": world,
        "parallel": parallel,
        "micro_batch": B,
        "K": K,
        "seq_len": T,
        "tokens_per_window": all_tokens,
        "tokens_per_window_per_gpu": tokens_per_window,
        "tokens_per_s": tokens_per_s,
        "window_ms": median_ms,
        "window_ms_min": min_ms,
        "peak_mem_gib": peak_bytes / 2**30,
        "accrue_arena_gib": outside_bytes / 2**30 if args.accrue_bridge else None,
        "close_ms_median": close_median,
        "cuda_graphs": args.cuda_graphs,
        "mfu": mfu,
        "loss": loss,
        "warmup": args.warmup,
        "windows": args.windows,
        "gpu": gpu,
        "torch": torch.__version__,
        "params": n_params,
        "bucket_cap_mb": args.bucket_cap_mb if parallel == "ddp no_sync" else None,
    }


def run_on_ranks(args, run, first_row, script, cpu_hint):
    """The body of a benchmark's main() under torchrun or alone: the device and
    process group from the launcher's variables, then run(torch, args, world,
    rank, device) -> the result row, printed as one JSON line by rank 0 (and
    by a rank that ran out of memory, whose row then says so: exit status 3).
    first_row(world) is the row that an out-of-memory error extends."""
    import torch
    import torch.distributed as dist

    if not args.cpu and not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA device ({cpu_hint})")
    world, rank, local_rank = launch_env()
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if world > 1:
        if args.cpu:
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("nccl", device_id=device)
    row = first_row(world)
    status = 0
    try:
        row = run(torch, args, world, rank, device)
    except torch.cuda.OutOfMemoryError:
        # Printed by the rank that ran out (torchrun then stops the others).
        row.update(error="out of memory", rank=rank,
                   gpu="cpu" if args.cpu else torch.cuda.get_device_name(device))
        status = 3
    if rank == 0 or status != 0:
        line = json.dumps(row)
        print(line, flush=True)
        if args.json and rank == 0:
            with open(args.json, "w") as f:
                f.write(line + "\n")
    if status != 0 and dist.is_initialized():
        # The other ranks may be waiting in a collective that never comes: leave
        # without a clean shutdown (torchrun stops the rest of the group).
        sys.stdout.flush()
        os._exit(status)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(status)


def main():
    args = parse_args()
    run_on_ranks(args, run,
                 lambda world: {"impl": "pytorch",
                                "mode": "compile" if args.compile else "eager",
        "recipe": "accrue_bridge" if args.accrue_bridge else "torch",
                                "compile": args.compile, "model": args.model, "world_size": world,
                                "micro_batch": args.micro_batch, "K": args.k,
                                "seq_len": args.seq_len},
                 "torch_gpt2.py", "use --cpu --model tiny to check the script")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch Llama / Qwen3 training throughput, the counterpart of `accrue_train --bench`.

    python3 bench/torch_llama.py --model llama-125m --micro-batch 8 --k 8             # eager
    python3 bench/torch_llama.py --model llama-125m --micro-batch 8 --k 8 --compile   # compiled
    python3 bench/torch_llama.py --model llama3.2-1b --micro-batch 8 --k 4 --impl transformers
    torchrun --standalone --nproc-per-node=2 bench/torch_llama.py --model llama3.2-1b \\
        --micro-batch 8 --k 4                                                        # DDP
    python3 bench/torch_llama.py --device cpu --model llama-tiny --seq-len 64 \\
        --micro-batch 2 --k 2 --windows 2                                            # smoke test

The model (--impl native, the default) is a plain PyTorch Llama written as
torchtitan writes its models: nn.Embedding, per block nn.RMSNorm, attention
(wq, wk, wv, wo without biases; Qwen3's per-head RMSNorm of q and k over
head_dim before the rotation; rotary embeddings; F.scaled_dot_product_attention
(q, k, v, is_causal=True, enable_gqa=True), the kv heads never repeated by
hand), nn.RMSNorm, the SwiGLU MLP w2(silu(w1 x) * w3 x), a final nn.RMSNorm and
the output layer (tied to the embedding where the preset ties it). The rotary
embedding is the real cos/sin form over the two halves of each head
(transformers' layout and torchtitan's for Qwen3; Llama 3's frequency scaling
for llama3.2-1b as transformers' "llama3" rope type computes it) rather than
torchtitan Llama 3's complex-number form, for which Inductor generates no code
(it would handicap --compile). Initialization as transformers' (and accrue's):
every weight matrix and the embedding normal(0, initializer_range = 0.02),
the norms ones; the throughput does not depend on it.

--impl transformers builds transformers' LlamaForCausalLM or Qwen3ForCausalLM
from the same configuration (random initialization, nothing downloaded,
attn_implementation="sdpa", use_cache=False) and trains it the same way; its
loss is its own (labels = the inputs, shifted inside, T - 1 tokens a row).

The presets are accrue's (nn/llama_config.cpp, LlamaConfig::from_name):

    llama-125m   12 layers, hidden 768, 12 / 4 heads of 64, SwiGLU 2048, vocab 32000,
                 untied, theta 1e4, eps 1e-5
    llama3.2-1b  16 layers, hidden 2048, 32 / 8 heads of 64, SwiGLU 8192, vocab 128256,
                 tied, theta 5e5 with llama3 scaling (32, 1, 4, 8192), eps 1e-5
    qwen3-0.6b   28 layers, hidden 1024, 16 / 8 heads of 128, SwiGLU 3072, vocab 151936,
                 tied, QK-norm, theta 1e6, eps 1e-6
    llama-tiny   2 layers, hidden 64, 4 / 2 heads of 16, SwiGLU 128, vocab 256, untied,
                 128 positions, eps 1e-6 (for CPU checks)
    qwen3-tiny   llama-tiny with heads of 32, tied, QK-norm

Training, as torchtitan and bench/torch_gpt2.py train: fp32 parameters under
torch.autocast(bfloat16), AdamW(fused=True on CUDA, lr 3e-4 (accrue_train's
default), betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-D weights
(the embedding and the linear layers), 0 on the norms), clip_grad_norm_(1.0).
One window of K micro-batches of B sequences of T tokens (random tokens,
uniform over the vocabulary, drawn once on the device: the data pipeline is
not timed):

    for k in range(K):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x_k)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y_k.flatten())  # token mean
        (loss / K).backward()                           # the window's token mean
    clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)

--compile compiles the model (torch.compile of the module, the DDP wrapper
under torchrun) and the loss (as torchtitan's "loss" compile component does).

Timing (as torch_gpt2.py): --warmup windows (torch.compile compiles there),
then --windows windows marked by CUDA events on the current stream with
nothing synchronizing the host between them; the window time is the median
gap, tokens/s = tokens per window / that median. Peak memory is
torch.cuda.max_memory_allocated over the warm-up and timed windows.

MFU, one formula for accrue and PyTorch (accrue_train's, Note [Llama FLOPs per
token] in examples/common/train_model.cpp; bench/llama_bench.py applies it to both
sides): model FLOPs per token

    6 (L (d q + 2 d kv + q d + 3 d f) + d V)  +  12 L h hd T

d the hidden size, h the query heads, hd head_dim, q = h hd, kv = kv_heads
hd, f the SwiGLU width, V the vocabulary (the output layer, tied or not), L
layers, T the sequence length. The first term is every weight matmul (q, k,
v, o, gate, up, down, output) at 2 FLOPs a multiply-add forward and 4
backward; the second the score and value products over T keys (causal
masking not discounted; PaLM appendix B). The embedding lookup, norms, RoPE,
SwiGLU's product and softmax are not counted. Against the GPU's dense bf16
peak (bench/torch_gpt2.py's table, or --peak-tflops); per GPU under DDP.

Data parallelism: launched by torchrun with WORLD_SIZE > 1, each rank drives
GPU LOCAL_RANK in an NCCL process group and trains the model wrapped in
DistributedDataParallel (bucket_cap_mb 25, gradient_as_bucket_view=True,
zero_grad(set_to_none=False)), each rank on its own random tokens, the first
K - 1 micro-steps under model.no_sync() so that only the last backward
all-reduces (DDP averages over ranks: the loss stays the global token mean).
B x K sequences per rank per window; tokens/s counts all ranks; the window
time and peak memory are the largest over ranks; MFU is per GPU. --fsdp
shards instead with FSDP2 (fully_shard on every block, then the root; bf16
parameters in compute and fp32 gradient reduction through its
MixedPrecisionPolicy instead of autocast; set_requires_gradient_sync(False)
for the first K - 1 micro-steps, so gradients accumulate unsharded and are
reduce-scattered once a window).

Prints ONE JSON line (bench/llama_bench.py reads it), with torch_gpt2.py's
keys (impl, mode, model, world_size, parallel, micro_batch, K, seq_len,
tokens_per_window, tokens_per_s, window_ms, window_ms_min, peak_mem_gib, mfu,
loss, gpu, torch, params, ...) and accrue_train_gpt2 --bench's
(tokens_per_s_median, window_ms_median, peak_memory_bytes, flops_per_token,
peak_flops, final_loss, config); on out-of-memory the same line with "error":
"out of memory" (exit status 3).

--device cpu (or --cpu) runs on the CPU with host timing (gloo under
torchrun), to check the script without a GPU (the numbers mean nothing).
"""
import argparse
import contextlib
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_gpt2 import (rank_figures, run_on_ranks,  # noqa: E402  (import no torch)
                        time_windows, training_setup)

# accrue's presets (nn/llama_config.cpp), field for field.
_BASE = dict(model_type="llama", vocab_size=32000, hidden=768, intermediate=2048, layers=12,
             heads=12, kv_heads=4, head_dim=64, max_positions=2048, rope_theta=10000.0,
             rope_scaling=None, rms_eps=1e-5, tie_word_embeddings=False, qk_norm=False,
             initializer_range=0.02)
_TINY = dict(_BASE, vocab_size=256, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2,
             head_dim=16, max_positions=128, rope_theta=10000.0, rms_eps=1e-6)
PRESETS = {
    "llama-125m": dict(_BASE),
    "llama3.2-1b": dict(_BASE, vocab_size=128256, hidden=2048, intermediate=8192, layers=16,
                        heads=32, kv_heads=8, head_dim=64, max_positions=131072,
                        rope_theta=500000.0,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0,
                                          original_max_position_embeddings=8192),
                        rms_eps=1e-5, tie_word_embeddings=True),
    "qwen3-0.6b": dict(_BASE, model_type="qwen3", vocab_size=151936, hidden=1024,
                       intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128,
                       max_positions=40960, rope_theta=1000000.0, rms_eps=1e-6,
                       tie_word_embeddings=True, qk_norm=True),
    "llama-tiny": dict(_TINY),
    "qwen3-tiny": dict(_TINY, model_type="qwen3", head_dim=32, tie_word_embeddings=True,
                       qk_norm=True),
}
# Sequences per window of the benchmark's points by model; others 32.
GLOBAL_SEQUENCES = {"llama-125m": 64, "llama3.2-1b": 32}


def parameter_count(c):
    """The parameters of preset c as transformers (and LlamaConfig::parameter_count) count
    them: a tied output layer once."""
    H, q, kv = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    per_layer = (H * q + 2 * H * kv + q * H + (2 * c["head_dim"] if c["qk_norm"] else 0)
                 + 3 * H * c["intermediate"] + 2 * H)
    embedding = c["vocab_size"] * H
    return embedding + c["layers"] * per_layer + H + (0 if c["tie_word_embeddings"] else embedding)


def flops_per_token(model, seq_len):
    """Training FLOPs per token as accrue_train counts them (see the module's docstring)."""
    c = PRESETS[model]
    d, f, L, V = c["hidden"], c["intermediate"], c["layers"], c["vocab_size"]
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    return 6 * (L * (d * q + 2 * d * kv + q * d + 3 * d * f) + d * V) + 12 * L * q * seq_len


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-125m", choices=sorted(PRESETS))
    p.add_argument("--impl", default="native", choices=["native", "transformers"],
                   help="this file's model, or transformers' *ForCausalLM of the same config")
    p.add_argument("--micro-batch", type=int, default=8, help="B: sequences per micro-batch")
    p.add_argument("--k", type=int, default=None,
                   help="K: micro-batches per window (default: --global-batch / B)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per window per GPU (default: 64 for llama-125m, else 32)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: FSDP2 (fully_shard) with accumulation instead of DDP")
    p.add_argument("--warmup", type=int, default=3, help="untimed windows first")
    p.add_argument("--windows", type=int, default=10, help="timed windows")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP's bucket size under torchrun with WORLD_SIZE > 1")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak for MFU (default: from its name)")
    p.add_argument("--profile", action="store_true",
                   help="after the timed windows, one more under torch.profiler: its 15 "
                        "costliest ops (GPU time; CPU time on the CPU) on stderr")
    p.add_argument("--json", help="also write the JSON line to this file")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu checks this script without a GPU (use --model llama-tiny)")
    p.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    args = p.parse_args(argv)
    if args.cpu:
        args.device = "cpu"
    args.cpu = args.device == "cpu"
    if args.global_batch is None:
        args.global_batch = GLOBAL_SEQUENCES.get(args.model, 32)
    if args.micro_batch < 1:
        p.error(f"--micro-batch {args.micro_batch} must be >= 1")
    if args.k is None:
        if args.global_batch % args.micro_batch != 0:
            p.error(f"--global-batch {args.global_batch} is not a multiple of --micro-batch "
                    f"{args.micro_batch}")
        args.k = args.global_batch // args.micro_batch
    if args.k < 1 or args.windows < 1 or args.warmup < 0:
        p.error("--k and --windows must be >= 1, --warmup >= 0")
    limit = PRESETS[args.model]["max_positions"]
    if args.seq_len < 2 or args.seq_len > limit:
        p.error(f"--seq-len {args.seq_len}: {args.model}'s context is 2 to {limit}")
    if args.bucket_cap_mb <= 0:
        p.error(f"--bucket-cap-mb {args.bucket_cap_mb} must be positive")
    return args


# ---- the model -------------------------------------------------------------------------------

def rope_tables(torch, c, seq_len):
    """cos and sin [seq_len, head_dim] in fp32: transformers' inv_freq (with its llama3
    scaling), each frequency twice (the two halves of a head)."""
    d = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    r = c["rope_scaling"]
    if r is not None:
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, smoothed, scaled)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos().float(), angles.sin().float()


def build_native(torch, c, seq_len):
    import torch.nn.functional as F
    from torch import nn

    H, D, nh, nkv = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"]

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(H, nh * D, bias=False)
            self.wk = nn.Linear(H, nkv * D, bias=False)
            self.wv = nn.Linear(H, nkv * D, bias=False)
            self.wo = nn.Linear(nh * D, H, bias=False)
            if c["qk_norm"]:
                self.q_norm = nn.RMSNorm(D, eps=c["rms_eps"])
                self.k_norm = nn.RMSNorm(D, eps=c["rms_eps"])

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q = self.wq(x).view(B, T, nh, D)
            k = self.wk(x).view(B, T, nkv, D)
            v = self.wv(x).view(B, T, nkv, D)
            if c["qk_norm"]:
                # q and k are bf16 under autocast, the norms' weights fp32: rms_norm's
                # fused kernel takes one dtype (mixed, it falls back to composed ops), so
                # the weights are cast, as torchtitan's bf16 parameters have them.
                q = F.rms_norm(q, (D,), self.q_norm.weight.to(q.dtype), self.q_norm.eps)
                k = F.rms_norm(k, (D,), self.k_norm.weight.to(k.dtype), self.k_norm.eps)
            cos_t = cos[:T].view(1, T, 1, D).to(q.dtype)
            sin_t = sin[:T].view(1, T, 1, D).to(q.dtype)
            q = q * cos_t + rotate_half(q) * sin_t
            k = k * cos_t + rotate_half(k) * sin_t
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True,
                                               enable_gqa=True)
            return self.wo(y.transpose(1, 2).contiguous().view(B, T, nh * D))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(H, c["intermediate"], bias=False)
            self.w2 = nn.Linear(c["intermediate"], H, bias=False)
            self.w3 = nn.Linear(H, c["intermediate"], bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.RMSNorm(H, eps=c["rms_eps"])
            self.attention = Attention()
            self.ffn_norm = nn.RMSNorm(H, eps=c["rms_eps"])
            self.feed_forward = FeedForward()

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(c["vocab_size"], H)
            self.layers = nn.ModuleList([TransformerBlock() for _ in range(c["layers"])])
            self.norm = nn.RMSNorm(H, eps=c["rms_eps"])
            self.output = nn.Linear(H, c["vocab_size"], bias=False)
            if c["tie_word_embeddings"]:
                self.output.weight = self.tok_embeddings.weight
            cos, sin = rope_tables(torch, c, seq_len)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=c["initializer_range"])

        def forward(self, idx):
            x = self.tok_embeddings(idx)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            return self.output(self.norm(x))

    return Transformer()


def build_transformers(c):
    import transformers

    kw = dict(vocab_size=c["vocab_size"], hidden_size=c["hidden"],
              intermediate_size=c["intermediate"], num_hidden_layers=c["layers"],
              num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
              head_dim=c["head_dim"], max_position_embeddings=c["max_positions"],
              rope_theta=c["rope_theta"], rms_norm_eps=c["rms_eps"],
              tie_word_embeddings=c["tie_word_embeddings"], attention_bias=False,
              hidden_act="silu", initializer_range=c["initializer_range"], use_cache=False,
              attn_implementation="sdpa")
    if c["model_type"] == "qwen3":
        config, cls = transformers.Qwen3Config(**kw), transformers.Qwen3ForCausalLM
    else:
        if c["rope_scaling"] is not None:
            kw["rope_scaling"] = dict(c["rope_scaling"])
        config, cls = transformers.LlamaConfig(**kw), transformers.LlamaForCausalLM
    return cls(config)


# ---- the run ---------------------------------------------------------------------------------

def apply_fsdp(torch, model, args):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = model.model.layers if args.impl == "transformers" else model.layers
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def profile_window(torch, args, window):
    """One more window under torch.profiler; its costliest ops on stderr (a slow run's where)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if args.cpu else [ProfilerActivity.CUDA])
    with profile(activities=activities) as prof:
        window()
        if not args.cpu:
            torch.cuda.synchronize()
    key = "self_cpu_time_total" if args.cpu else "self_device_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=70),
          file=sys.stderr, flush=True)


def run(torch, args, world, rank, device):
    import torch.nn.functional as F

    c = PRESETS[args.model]
    torch.manual_seed(1234)  # every rank the same weights (DDP broadcasts rank 0's anyway)
    with device:  # built in place: a 128k-row table drawn on the host takes seconds
        if args.impl == "transformers":
            model = build_transformers(c)
        else:
            model = build_native(torch, c, args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != parameter_count(c):
        raise RuntimeError(f"{args.impl} {args.model}: {n_params} parameters, accrue's preset "
                           f"has {parameter_count(c)}")
    fsdp = world > 1 and args.fsdp
    if fsdp:
        model = apply_fsdp(torch, model, args)
    opt, ddp, step_model, batches = training_setup(torch, args, model, world, rank, device,
                                                   c["vocab_size"], wrap_ddp=not fsdp)
    # Under DDP the gradients stay views of the buckets (set_to_none would drop them).
    set_to_none = ddp is None
    B, K, T = args.micro_batch, args.k, args.seq_len
    tokens_per_window = B * K * T  # this rank's

    def autocast():
        # FSDP2 computes in bf16 through its MixedPrecisionPolicy instead.
        if fsdp:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def cross_entropy(logits, y):
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    if args.compile:  # torchtitan compiles the loss too (its "loss" compile component)
        cross_entropy = torch.compile(cross_entropy)

    def micro_loss(x, y):
        if args.impl == "transformers":
            with autocast():
                return step_model(input_ids=x, labels=x).loss  # shifted inside
        with autocast():
            logits = step_model(x)
        return cross_entropy(logits, y)

    losses = []

    def window():
        total = None
        for k in range(K):
            x, y = batches[k % len(batches)]
            last = k == K - 1
            # Only the window's last backward all-reduces (DDP's no_sync before it;
            # FSDP2 keeps unsharded gradients until then).
            if fsdp:
                model.set_requires_gradient_sync(last)
            sync = ddp is None or last
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss = micro_loss(x, y)
                (loss / K).backward()
            total = loss.detach() if total is None else total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(total / K)

    window_ms = time_windows(torch, args, device, window)
    if args.profile:
        profile_window(torch, args, window)
    loss = float(losses[-1])
    if not math.isfinite(loss):
        raise RuntimeError(f"the last window's loss is {loss}")

    # The slowest rank's figures; on the CPU the memory keys are null.
    f = rank_figures(torch, args, device, window_ms, tokens_per_window, world)
    median_ms, min_ms, peak_bytes, all_tokens = f["median_ms"], f["min_ms"], f["peak_bytes"], \
        f["all_tokens"]
    tokens_per_s, gpu, peak = f["tokens_per_s"], f["gpu"], f["peak"]
    fpt = flops_per_token(args.model, T)
    mfu = tokens_per_s * fpt / (peak * 1e12 * world) if peak else None  # per GPU
    parallel = "fsdp2 no grad sync" if fsdp else ("ddp no_sync" if ddp is not None else "none")
    row = {
        "impl": "transformers" if args.impl == "transformers" else "pytorch",
        "mode": "compile" if args.compile else "eager",
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
        "peak_mem_gib": None if args.cpu else peak_bytes / 2**30,
        "mfu": mfu,
        "loss": loss,
        "warmup": args.warmup,
        "windows": args.windows,
        "gpu": gpu,
        "torch": torch.__version__,
        "params": n_params,
        "bucket_cap_mb": args.bucket_cap_mb if ddp is not None else None,
        # accrue_train_gpt2 --bench's keys for the same figures.
        "tokens_per_s_median": tokens_per_s,
        "window_ms_median": median_ms,
        "peak_memory_bytes": None if args.cpu else int(peak_bytes),
        "flops_per_token": fpt,
        "peak_flops": peak * 1e12 if peak else None,
        "final_loss": loss,
        "config": dict(c, name=args.model, parameters=n_params),
    }
    if args.impl == "transformers":
        import transformers

        row["transformers"] = transformers.__version__
    return row


def main(argv=None):
    args = parse_args(argv)
    run_on_ranks(args, run,
                 lambda world: {"impl": "transformers" if args.impl == "transformers" else "pytorch",
                                "mode": "compile" if args.compile else "eager",
                                "model": args.model, "world_size": world,
                                "micro_batch": args.micro_batch, "K": args.k,
                                "seq_len": args.seq_len},
                 "torch_llama.py", "use --device cpu --model llama-tiny to check the script")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Generates the GPT-2 golden fixtures: a tiny GPT-2 trained by PyTorch, for accrue to replay.

    python3 tests/golden/make_gpt2_golden.py --out tests/golden/fixtures/gpt2

The model is written here from scratch (about 100 lines, class GPT2) to match
nn::GPT2 exactly: pre-LN blocks, LayerNorm eps 1e-5, causal attention scaled
by 1/sqrt(head_dim), GELU with the tanh approximation, nn.Linear layout
[out, in], the output layer tied to wte, parameters named as accrue names them
(wte, wpe, h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight, ..., ln_f.bias).

One training recipe, three runs of it:

  windows of K = 4 micro-batches of B = 4 sequences of T = 32 tokens;
  per micro-batch: loss_k = cross_entropy(logits, targets, reduction="sum"),
                   (loss_k / N).backward(), N = the window's K * B * T tokens
                   (the large-batch mean, accrue's item-count normalization);
  per window:      clip_grad_norm_(1.0), AdamW step at lr 1e-3 * WarmupCosine,
                   betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the Linear
                   weights only (not biases, LayerNorm, wte, wpe: as in GPT-2).

Files (safetensors; hyperparameters in each file's __metadata__, floats with
repr() so they parse back to the same double):

  model.safetensors     the config, the token batches (i64 [50, 16, 33]: window,
                        sequence, T + 1 tokens; inputs are [:, :, :T], targets
                        [:, :, 1:]) and the initial weights init.<name> (f32,
                        from one torch seed, saved under accrue's names).
  cpu_f64.safetensors   10 windows in float64 on the CPU: per-window loss and
                        pre-clip gradient norm (f64 [10]), final.<name> (f64).
  cuda_f32.safetensors  the same 10 windows in float32 on CUDA, TF32 off (a
                        yardstick: how far fp32 lands from the f64 run).
  cuda_bf16.safetensors 50 windows under torch.autocast(bfloat16) on CUDA, fp32
                        parameters and optimizer: the per-window loss curve.

Without CUDA only the first two are written (the GPU test then says how to make
the others). Deterministic: one seed, CPU random numbers. Runs in well under a
minute on a GPU machine (the f64 CPU run is most of it).
"""

import argparse
import contextlib
import math
import os
import sys
import time

SEED = 20251126

# The tiny GPT-2 (nn::GPT2Config's fields).
CONFIG = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=128,
              padded_vocab_size=128, dropout=0.0)
LN_EPS = 1e-5

# The batches: windows of K micro-batches of B sequences of T tokens.
SEQ_LEN = 32
MICRO_BATCH = 4
MICRO_STEPS = 4
WINDOWS = 10        # the f64 and f32 runs
BF16_WINDOWS = 50   # the bf16 curve

# AdamW and the window, as accrue's optim::Optimizer / optim::Window take them.
OPTIM = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0,
             min_factor=0.1)
# optim::WarmupCosine(warmup, total, min_factor) per run: warmup then cosine to the last window.
SCHEDULES = dict(f64=dict(warmup=2, total=WINDOWS), f32=dict(warmup=2, total=WINDOWS),
                 bf16=dict(warmup=5, total=BF16_WINDOWS))

# The token source: a Markov chain over the vocabulary where each token has
# SUCCESSORS likely next tokens with these probabilities (entropy 1.2 nats
# against log(128) = 4.85 at the start), so the loss falls.
SUCCESSOR_PROBS = [0.55, 0.25, 0.12, 0.08]


def warmup_cosine(step, warmup, total, min_factor):
    """optim::WarmupCosine::factor (optim/optimizer.cpp), 0-based window index."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return min_factor
    progress = (step - warmup) / (total - warmup)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def is_decayed(name):
    """Weight decay applies to the Linear weights only (as in GPT-2)."""
    return name.endswith(".weight") and (".attn." in name or ".mlp." in name)


def meta_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def build(torch):
    """The model class, defined once torch is imported (the module loads without torch)."""
    F = torch.nn.functional
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self, c, sdpa):
            super().__init__()
            self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
            self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
            self.n_head = c["n_head"]
            self.sdpa = sdpa

        def forward(self, x):
            B, T, C = x.shape
            H = self.n_head
            q, k, v = self.c_attn(x).split(C, dim=2)  # q, k, v packed in that order
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if self.sdpa:
                # bf16: the fused kernel (flash), as GPT-2 training runs it.
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # f64/f32: plain math, every GEMM under the matmul precision set
                # (the fused kernels may not honour TF32 off for float32).
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
                y = att @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
            self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, c, sdpa):
            super().__init__()
            self.ln_1 = nn.LayerNorm(c["n_embd"], eps=LN_EPS)
            self.attn = Attention(c, sdpa)
            self.ln_2 = nn.LayerNorm(c["n_embd"], eps=LN_EPS)
            self.mlp = MLP(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):
        def __init__(self, c, sdpa=False):
            super().__init__()
            self.c = c
            self.wte = nn.Parameter(torch.empty(c["padded_vocab_size"], c["n_embd"]))
            self.wpe = nn.Parameter(torch.empty(c["block_size"], c["n_embd"]))
            self.h = nn.ModuleList([Block(c, sdpa) for _ in range(c["n_layer"])])
            self.ln_f = nn.LayerNorm(c["n_embd"], eps=LN_EPS)

        def loss(self, idx, targets):
            """The summed cross-entropy over every token (in float32 or wider): accrue's Loss.sum."""
            T = idx.shape[1]
            x = F.embedding(idx, self.wte) + self.wpe[:T]
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte)  # tied output layer
            V = self.c["vocab_size"]  # padded columns take no part in the softmax
            logits = logits[..., :V].reshape(-1, V)
            if logits.dtype != torch.float64:
                logits = logits.float()
            return F.cross_entropy(logits, targets.reshape(-1), reduction="sum")

    return GPT2


def initial_weights(torch, model, gen):
    """GPT-2's initialization from `gen` (float32), with one change: biases and
    LayerNorm parameters are random too, so that a swapped or transposed one
    changes the very first step instead of hiding behind zeros and ones."""
    n_layer = model.c["n_layer"]
    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        randn = lambda: torch.randn(shape, generator=gen, dtype=torch.float32)  # noqa: E731
        if name in ("wte", "wpe"):
            w = randn() * 0.02
        elif ".ln_" in name or name.startswith("ln_f."):
            w = (1.0 + 0.1 * randn()) if name.endswith(".weight") else 0.02 * randn()
        elif name.endswith(".bias"):
            w = 0.02 * randn()
        elif name.endswith("c_proj.weight"):  # residual projections, scaled as in GPT-2
            w = randn() * (0.02 / math.sqrt(2 * n_layer))
        else:
            w = randn() * 0.02
        out[name] = w
    return out


def make_tokens(torch, gen, windows, sequences, length, vocab):
    """i64 [windows, sequences, length] from the Markov chain (SUCCESSOR_PROBS)."""
    probs = torch.zeros(vocab, vocab, dtype=torch.float64)
    for row in range(vocab):
        successors = torch.randperm(vocab, generator=gen)[:len(SUCCESSOR_PROBS)]
        probs[row, successors] = torch.tensor(SUCCESSOR_PROBS, dtype=torch.float64)
    n = windows * sequences
    seq = torch.empty(n, length, dtype=torch.int64)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=gen)
    for t in range(1, length):
        seq[:, t] = torch.multinomial(probs[seq[:, t - 1]], 1, generator=gen).squeeze(1)
    return seq.view(windows, sequences, length)


def train(torch, GPT2, init, tokens, windows, schedule, device, dtype, autocast, log):
    """The recipe of the module docstring; returns per-window loss and norm, final weights."""
    model = GPT2(CONFIG, sdpa=autocast).to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name].to(device=device, dtype=dtype))
    named = list(model.named_parameters())
    decay = [p for n, p in named if is_decayed(n)]
    no_decay = [p for n, p in named if not is_decayed(n)]
    # foreach=False, fused=False: the single-tensor reference math (one formula
    # per element, as accrue's fused pass).
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]),
                            eps=OPTIM["eps"], foreach=False, fused=False)
    losses, norms = [], []
    B, K = MICRO_BATCH, MICRO_STEPS
    for w in range(windows):
        lr = OPTIM["lr"] * warmup_cosine(w, schedule["warmup"], schedule["total"],
                                         OPTIM["min_factor"])
        for group in opt.param_groups:
            group["lr"] = lr
        batch = tokens[w].to(device)  # [K * B, T + 1]
        count = batch.shape[0] * (batch.shape[1] - 1)  # N: every target counts
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for k in range(K):
            micro = batch[k * B:(k + 1) * B]
            context = (torch.autocast("cuda", dtype=torch.bfloat16) if autocast
                       else contextlib.nullcontext())
            with context:
                loss = model.loss(micro[:, :-1], micro[:, 1:])
            (loss / count).backward()
            loss_sum += loss.detach().double()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["max_grad_norm"],
                                              foreach=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss_sum) / count)
        norms.append(float(norm))
        log(f"  window {w:2d}: lr {lr:.3e} loss {losses[-1]:.10f} grad norm {norms[-1]:.10f}")
    final = {n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}
    return losses, norms, final


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/golden/fixtures/gpt2",
                        help="directory to write the fixtures into")
    parser.add_argument("--skip-cuda", action="store_true",
                        help="write only the CPU fixtures even when CUDA is available")
    parser.add_argument("--quiet", action="store_true", help="no per-window lines")
    args = parser.parse_args()

    import torch
    try:
        from safetensors.torch import save_file
    except ImportError:
        sys.exit("make_gpt2_golden.py needs the safetensors package (pip install safetensors)")

    log = (lambda s: None) if args.quiet else print
    GPT2 = build(torch)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(SEED)
    # Initial weights first, then the tokens, both from the one generator.
    init = initial_weights(torch, GPT2(CONFIG), gen)
    sequences = MICRO_STEPS * MICRO_BATCH
    tokens = make_tokens(torch, gen, BF16_WINDOWS, sequences, SEQ_LEN + 1, CONFIG["vocab_size"])

    os.makedirs(args.out, exist_ok=True)
    command = "python3 tests/golden/make_gpt2_golden.py"
    if args.skip_cuda:
        command += " --skip-cuda"
    common = {"generated_by": "tests/golden/make_gpt2_golden.py", "command": command,
              "torch_version": torch.__version__, "seed": str(SEED)}

    def save(name, tensors, meta):
        path = os.path.join(args.out, name)
        save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()},
                  path, metadata={**common, **meta})
        print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")

    model_meta = {k: meta_value(v) for k, v in CONFIG.items()}
    model_meta.update({"ln_eps": meta_value(LN_EPS), "seq_len": str(SEQ_LEN),
                       "micro_batch": str(MICRO_BATCH), "micro_steps": str(MICRO_STEPS),
                       "token_windows": str(BF16_WINDOWS),
                       "successor_probs": ",".join(repr(p) for p in SUCCESSOR_PROBS),
                       "decayed": "Linear weights: h.*.attn.*.weight, h.*.mlp.*.weight"})
    model_meta.update({k: meta_value(v) for k, v in OPTIM.items()})
    save("model.safetensors", {"tokens": tokens, **{f"init.{n}": w for n, w in init.items()}},
         model_meta)

    summary = []

    def run(label, file_name, windows, device, dtype, autocast, final_dtype, extra_meta):
        schedule = SCHEDULES[label]
        print(f"{label}: {windows} windows on {device}, {dtype}, autocast {autocast}")
        start = time.time()
        losses, norms, final = train(torch, GPT2, init, tokens, windows, schedule, device, dtype,
                                     autocast, log)
        seconds = time.time() - start
        tensors = {"loss": torch.tensor(losses, dtype=torch.float64),
                   "grad_norm": torch.tensor(norms, dtype=torch.float64)}
        if final_dtype is not None:
            tensors.update({f"final.{n}": p.to(final_dtype) for n, p in final.items()})
        meta = {"windows": str(windows), "device": device,
                "dtype": str(dtype).replace("torch.", ""),
                "warmup": str(schedule["warmup"]), "total": str(schedule["total"]),
                "min_factor": meta_value(OPTIM["min_factor"]),
                "implementation": "AdamW(foreach=False, fused=False); "
                                  "clip_grad_norm_(foreach=False); (loss_sum / N).backward()"}
        meta.update(extra_meta)
        save(file_name, tensors, meta)
        clipped = sum(1 for n in norms if n > OPTIM["max_grad_norm"])
        summary.append(f"{label:5s} loss {losses[0]:.4f} -> {losses[-1]:.4f}, grad norm "
                       f"{norms[0]:.3f} -> {norms[-1]:.3f} ({clipped}/{windows} windows clipped), "
                       f"{seconds:.1f} s")

    run("f64", "cpu_f64.safetensors", WINDOWS, "cpu", torch.float64, False, torch.float64, {})
    if args.skip_cuda or not torch.cuda.is_available():
        summary.append("cuda_f32.safetensors and cuda_bf16.safetensors not written: "
                       + ("--skip-cuda" if args.skip_cuda else "no CUDA device"))
    else:
        # TF32 off for every float32 GEMM (accrue's GPU test sets
        # kernels::set_allow_tf32(false)); "highest" is the documented switch.
        torch.set_float32_matmul_precision("highest")
        gpu = torch.cuda.get_device_name()
        run("f32", "cuda_f32.safetensors", WINDOWS, "cuda", torch.float32, False, torch.float32,
            {"gpu": gpu, "float32_matmul_precision": torch.get_float32_matmul_precision()})
        run("bf16", "cuda_bf16.safetensors", BF16_WINDOWS, "cuda", torch.float32, True, None,
            {"gpu": gpu, "autocast": "bfloat16 (parameters, gradients, AdamW in float32)",
             "attention": "F.scaled_dot_product_attention(is_causal=True)"})
    print("summary:")
    for line in summary:
        print("  " + line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Generates the Llama golden fixtures: transformers' LlamaForCausalLM trained by
PyTorch on right-padded variable-length batches, for examples/llama_tiny to replay.

    python3 tests/golden/make_llama_golden.py --out tests/golden/fixtures/llama

The model is transformers' own LlamaForCausalLM (grouped-query attention,
4 query heads over 2 key/value heads, RMSNorm, rotary embeddings, SwiGLU, an
untied head), with attn_implementation="sdpa". Two of its float32 habits are
patched for the float64 run only, because they would cap a float64 comparison
at float32's precision: LlamaRMSNorm computes in float32 and casts back, and
LlamaRotaryEmbedding computes its cos/sin tables in float32. Patched, both work
in the input's dtype (tables from inv_freq = 1 / theta^(2i/D) in float64); in a
float32 model the patches would change nothing, so the float32 run uses
transformers unpatched.

The recipe, per window of K = 2 micro-batches of B = 3 right-padded sequences
of at most T = 16 tokens (sequence b has lengths[b] real tokens, then pad 0;
its targets past lengths[b] are -100):
  per micro-batch: loss_k = cross_entropy(logits, targets, ignore_index=-100,
                   reduction="sum"); (loss_k / N).backward(), N = the window's
                   count of real targets (accrue's item-count normalization);
  per window:      clip_grad_norm_(1.0), AdamW lr 3e-3, betas (0.9, 0.95),
                   eps 1e-8, weight decay 0.1 on the 2-D weights (not the norms).

Files (safetensors; the config and hyperparameters in __metadata__):
  model.safetensors    tokens i64 [W, K, B, T + 1] (inputs [..., :T], targets
                       [..., 1:]), lengths i64 [W, K, B], init.<name> (f32).
  cpu_f64.safetensors  W windows in float64 on the CPU: loss and pre-clip
                       gradient norm per window (f64 [W]), final.<name> (f64).
  cpu_f32.safetensors  the same in float32 on the CPU, transformers unpatched.
Deterministic: one seed, CPU random numbers; a few seconds.
"""

import argparse
import os

SEED = 20261127
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
WINDOWS, MICRO_STEPS, MICRO_BATCH, SEQ_LEN, MIN_LEN = 20, 2, 3, 16, 4
OPTIM = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)


def patch_for_f64(torch, llama):
    """RMSNorm and the rotary tables in the input's dtype (see the docstring)."""

    def rms_forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    def rotary_forward(self, x, position_ids):
        dim = self.inv_freq.shape[0] * 2
        inv_freq = 1.0 / (CONFIG["rope_theta"] ** (
            torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    llama.LlamaRMSNorm.forward = rms_forward
    llama.LlamaRotaryEmbedding.forward = rotary_forward


def make_batches(torch, gen):
    V = CONFIG["vocab_size"]
    tokens = torch.randint(1, V, (WINDOWS, MICRO_STEPS, MICRO_BATCH, SEQ_LEN + 1), generator=gen)
    # A learnable pattern: every other token repeats the one before it.
    tokens[..., 1::2] = tokens[..., 0:-1:2]
    lengths = torch.randint(MIN_LEN, SEQ_LEN + 1, (WINDOWS, MICRO_STEPS, MICRO_BATCH), generator=gen)
    return tokens, lengths


def split(torch, tokens, lengths):
    """inputs (pad 0 past each length), targets (-100 past it), attention mask."""
    T = SEQ_LEN
    real = torch.arange(T)[None, :] < lengths[:, None]
    inputs = torch.where(real, tokens[:, :T], torch.zeros_like(tokens[:, :T]))
    targets = torch.where(real, tokens[:, 1:], torch.full_like(tokens[:, 1:], -100))
    return inputs, targets, real.to(torch.int64)


def train(torch, model, tokens, lengths):
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.dim() >= 2]
    no_decay = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], foreach=False)
    losses, norms = [], []
    for w in range(WINDOWS):
        batches = [split(torch, tokens[w, k], lengths[w, k]) for k in range(MICRO_STEPS)]
        N = sum(int((t != -100).sum()) for _, t, _ in batches)
        total = 0.0
        opt.zero_grad(set_to_none=True)
        for inputs, targets, mask in batches:
            logits = model(input_ids=inputs, attention_mask=mask).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, CONFIG["vocab_size"]), targets.reshape(-1),
                ignore_index=-100, reduction="sum")
            (loss / N).backward()
            total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["max_grad_norm"],
                                              foreach=False)
        opt.step()
        losses.append(total / N)
        norms.append(float(norm))
    return losses, norms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="fixture directory to write")
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    config = LlamaConfig(**CONFIG, attn_implementation="sdpa")
    init = {n: p.detach().clone().float() for n, p in LlamaForCausalLM(config).named_parameters()}
    tokens, lengths = make_batches(torch, gen)
    meta = {k: repr(v) for k, v in CONFIG.items()}
    meta.update({k: repr(v) for k, v in OPTIM.items() if k != "betas"})
    meta.update(beta1=repr(OPTIM["betas"][0]), beta2=repr(OPTIM["betas"][1]),
                windows=str(WINDOWS), micro_steps=str(MICRO_STEPS), micro_batch=str(MICRO_BATCH),
                seq_len=str(SEQ_LEN), torch=torch.__version__,
                transformers=__import__("transformers").__version__)
    os.makedirs(args.out, exist_ok=True)
    save_file({"tokens": tokens.contiguous(), "lengths": lengths.contiguous(),
               **{"init." + n: t.contiguous() for n, t in init.items()}},
              os.path.join(args.out, "model.safetensors"), metadata=meta)

    def run(dtype, file_name):
        model = LlamaForCausalLM(config).to(dtype)
        model.load_state_dict({n: t.to(dtype) for n, t in init.items()})
        losses, norms = train(torch, model, tokens, lengths)
        save_file({"loss": torch.tensor(losses, dtype=torch.float64),
                   "grad_norm": torch.tensor(norms, dtype=torch.float64),
                   **{"final." + n: p.detach().clone().contiguous()
                      for n, p in model.named_parameters()}},
                  os.path.join(args.out, file_name), metadata=meta)
        print(f"{file_name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"grad norm {norms[0]:.3f} -> {norms[-1]:.3f}")

    run(torch.float32, "cpu_f32.safetensors")  # before the patches: transformers as shipped
    patch_for_f64(torch, modeling_llama)
    run(torch.float64, "cpu_f64.safetensors")


if __name__ == "__main__":
    main()

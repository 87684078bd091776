#!/usr/bin/env python3
"""Generates the nn::Llama golden fixtures: transformers' LlamaForCausalLM and
Qwen3ForCausalLM trained by PyTorch in float64, for tests/golden/llama_hf_golden_test.cpp.

    /work/torchpy tests/golden/make_llama_hf_golden.py --out tests/golden/fixtures/llama_hf

Three tiny models, each a subdirectory of --out:
  llama         LlamaForCausalLM, 4 query heads over 2 key/value heads, untied head.
  llama_scaled  LlamaForCausalLM, 4 query heads over 1, tied head, attention
                biases, llama3 rope scaling (original 64 positions, factor 4: of
                the 4 frequencies of a head of 8, one is kept, one interpolated,
                two divided by the factor).
  qwen3         Qwen3ForCausalLM, 4 query heads over 2 of head_dim 12 (not
                hidden / heads = 8), per-head QK-norm, tied head.

Each holds:
  hf/                  the initial weights (float32) as save_pretrained writes them,
                       sharded (max_shard_size 40KB: the index and several files).
  data.safetensors     tokens i64 [W, K, B, T + 1] (inputs [..., :T], targets [..., 1:]),
                       lengths i64 [W, K, B]; the recipe in __metadata__.
  cpu_f64.safetensors  the float64 run: loss and pre-clip gradient norm per window
                       (f64 [W]), final.<name> (f64) for every parameter.

The recipe (as make_llama_golden.py), per window of K = 4 micro-batches of B = 3
right-padded sequences of at most T = 16 tokens (sequence b has lengths[b] real
tokens, then pad 0; its targets past lengths[b] are -100): loss_k =
cross_entropy(logits, targets, ignore_index=-100, reduction="sum") and
(loss_k / N).backward() with N the window's real targets; per window
clip_grad_norm_(1.0) and AdamW (lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on the 2-D weights only).

transformers' float32 habits are patched for the float64 run, as
make_llama_golden.py explains: LlamaRMSNorm and Qwen3RMSNorm compute in float32
and cast back, and the rotary classes build inv_freq and cos/sin in float32
(including the llama3 scaling). Patched, all of it is computed in float64 with
transformers' formulas. The check at the end loads every hf/ directory back
with from_pretrained. Deterministic; CPU torch 2.15 / transformers 5.24, a few
seconds.

With --cuda DIR (on the GPU machine, after the fixtures exist) it adds to
each case of DIR, from transformers' own float32 model on CUDA (TF32 off):
  cuda_f32.safetensors   the same 20 windows in float32: loss, grad_norm,
                         final.<name> (float32), the yardstick of what float32
                         costs beside accrue's float32 run.
  cuda_bf16.safetensors  50 windows (window w trains on window w % 20) with the
                         forward under torch.autocast(bfloat16), fp32 parameters
                         and AdamW: loss and grad_norm per window.

With --check-save DIR it instead loads DIR (written by nn::Llama::save_hf)
with from_pretrained (float64, patched) and compares its logits on the input
of DIR/../logits.safetensors with accrue's there (within 1e-12); it exits 77
(skipped) without torch and transformers.
"""

import argparse
import math
import os
import shutil

SEED = 20261127
WINDOWS, MICRO_STEPS, MICRO_BATCH, SEQ_LEN, MIN_LEN = 20, 4, 3, 16, 4
BF16_WINDOWS = 50  # the bf16 curve: the fixture's 20 windows, then again from the first
OPTIM = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
COMMON = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, rms_norm_eps=1e-6)
CASES = {
    "llama": ("llama", dict(COMMON, intermediate_size=32, num_key_value_heads=2,
                            rope_theta=10000.0, tie_word_embeddings=False)),
    "llama_scaled": ("llama", dict(COMMON, intermediate_size=24, num_key_value_heads=1,
                                   rope_theta=10000.0, tie_word_embeddings=True,
                                   attention_bias=True,
                                   rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 64})),
    "qwen3": ("qwen3", dict(COMMON, intermediate_size=32, num_key_value_heads=2, head_dim=12,
                            rope_theta=1000000.0, tie_word_embeddings=True)),
}


def f64_inv_freq(torch, config):
    """transformers' inv_freq (default or llama3) computed in float64."""
    rope = config.rope_parameters
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rope.get("rope_type", "default") == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def patch_for_f64(torch, modules):
    def rms_forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    def rotary_forward(self, x, position_ids):
        inv_freq = f64_inv_freq(torch, self.config)
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), \
            (emb.sin() * self.attention_scaling).to(x.dtype)

    for norm, rotary in modules:
        norm.forward = rms_forward
        rotary.forward = rotary_forward


def make_batches(torch, gen, vocab):
    tokens = torch.randint(1, vocab, (WINDOWS, MICRO_STEPS, MICRO_BATCH, SEQ_LEN + 1),
                           generator=gen)
    tokens[..., 1::2] = tokens[..., 0:-1:2]  # learnable: every other token repeats
    lengths = torch.randint(MIN_LEN, SEQ_LEN + 1, (WINDOWS, MICRO_STEPS, MICRO_BATCH),
                            generator=gen)
    return tokens, lengths


def split(torch, tokens, lengths):
    T = SEQ_LEN
    real = torch.arange(T)[None, :] < lengths[:, None]
    inputs = torch.where(real, tokens[:, :T], torch.zeros_like(tokens[:, :T]))
    targets = torch.where(real, tokens[:, 1:], torch.full_like(tokens[:, 1:], -100))
    return inputs, targets, real.to(torch.int64)


def train(torch, model, tokens, lengths, vocab, windows=WINDOWS, device="cpu", autocast=False):
    """Window w trains on the fixture's window w % WINDOWS."""
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], foreach=False)
    losses, norms = [], []
    for w in range(windows):
        batches = [[t.to(device) for t in split(torch, tokens[w % WINDOWS, k],
                                                lengths[w % WINDOWS, k])]
                   for k in range(MICRO_STEPS)]
        N = sum(int((t != -100).sum()) for _, t, _ in batches)
        total = 0.0
        opt.zero_grad(set_to_none=True)
        for inputs, targets, mask in batches:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=inputs, attention_mask=mask).logits
            if autocast:
                logits = logits.float()  # the loss in fp32, as autocast's cross_entropy
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            (loss / N).backward()
            total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["max_grad_norm"],
                                              foreach=False)
        opt.step()
        losses.append(total / N)
        norms.append(float(norm))
    return losses, norms


def check_save(torch, directory):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3
    patch_for_f64(torch, [(modeling_llama.LlamaRMSNorm, modeling_llama.LlamaRotaryEmbedding),
                          (modeling_qwen3.Qwen3RMSNorm, modeling_qwen3.Qwen3RotaryEmbedding)])
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64)
    ref = load_file(os.path.join(directory, "..", "logits.safetensors"))
    with torch.no_grad():
        logits = model(input_ids=ref["idx"]).logits
    err = float((logits - ref["logits"]).abs().max())
    print(f"{directory}: {type(model).__name__} loaded; max |logits - accrue's| = {err:.3g}")
    return err


def make_cuda_runs(torch, directory, device):
    """cuda_f32.safetensors and cuda_bf16.safetensors beside each case's data."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    for name in CASES:
        out = os.path.join(directory, name)
        data = load_file(os.path.join(out, "data.safetensors"))
        vocab = CASES[name][1]["vocab_size"]
        for label, windows, autocast in (("f32", WINDOWS, False), ("bf16", BF16_WINDOWS, True)):
            model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "hf"),
                                                         dtype=torch.float32,
                                                         attn_implementation="sdpa").to(device)
            losses, norms = train(torch, model, data["tokens"], data["lengths"], vocab, windows,
                                  device, autocast)
            tensors = {"loss": torch.tensor(losses, dtype=torch.float64),
                       "grad_norm": torch.tensor(norms, dtype=torch.float64)}
            if not autocast:
                tensors.update({"final." + n: p.detach().cpu().clone().contiguous()
                                for n, p in model.named_parameters()})
            meta = dict(windows=str(windows), gpu=gpu, torch=torch.__version__,
                        recipe="fp32 parameters and AdamW" +
                        (", forward under torch.autocast(bfloat16)" if autocast else
                         ", TF32 off"))
            save_file(tensors, os.path.join(out, f"cuda_{label}.safetensors"), metadata=meta)
            print(f"{name} {label} on {gpu}: {windows} windows, loss {losses[0]:.4f} -> "
                  f"{losses[-1]:.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="fixture directory to write")
    parser.add_argument("--check-save", help="a directory nn::Llama::save_hf wrote")
    parser.add_argument("--cuda", metavar="DIR",
                        help="add the CUDA runs (f32, bf16) to the fixture directory DIR")
    parser.add_argument("--device", default="cuda",
                        help="with --cuda: the torch device (cpu only to try the script)")
    args = parser.parse_args()
    if args.cuda:
        import torch
        make_cuda_runs(torch, args.cuda, args.device)
        return
    if args.check_save:
        try:
            import torch
            import transformers  # noqa: F401
        except ImportError:
            print("torch and transformers are not installed: skipped")
            raise SystemExit(77)
        raise SystemExit(0 if check_save(torch, args.check_save) < 1e-12 else 1)
    import torch
    from safetensors.torch import save_file
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    patched = False
    for name, (kind, cfg) in CASES.items():
        config_class, model_class = classes[kind]
        config = config_class(**cfg, attn_implementation="sdpa")
        torch.manual_seed(SEED)
        gen = torch.Generator().manual_seed(SEED + len(name))
        init_model = model_class(config)  # float32, transformers' initialization
        out = os.path.join(args.out, name)
        shutil.rmtree(out, ignore_errors=True)
        init_model.save_pretrained(os.path.join(out, "hf"), max_shard_size="40KB")
        gen_cfg = os.path.join(out, "hf", "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
        tokens, lengths = make_batches(torch, gen, cfg["vocab_size"])
        meta = {k: repr(v) for k, v in OPTIM.items() if k != "betas"}
        meta.update(beta1=repr(OPTIM["betas"][0]), beta2=repr(OPTIM["betas"][1]),
                    windows=str(WINDOWS), micro_steps=str(MICRO_STEPS),
                    micro_batch=str(MICRO_BATCH), seq_len=str(SEQ_LEN),
                    torch=torch.__version__, transformers=transformers.__version__)
        save_file({"tokens": tokens.contiguous(), "lengths": lengths.contiguous()},
                  os.path.join(out, "data.safetensors"), metadata=meta)
        if not patched:
            patch_for_f64(torch, [(modeling_llama.LlamaRMSNorm, modeling_llama.LlamaRotaryEmbedding),
                                  (modeling_qwen3.Qwen3RMSNorm,
                                   modeling_qwen3.Qwen3RotaryEmbedding)])
            patched = True
        model = model_class.from_pretrained(os.path.join(out, "hf"), dtype=torch.float64,
                                            attn_implementation="sdpa")
        for n, p in model.named_parameters():
            assert torch.equal(p, dict(init_model.named_parameters())[n].double()), n
        losses, norms = train(torch, model, tokens, lengths, cfg["vocab_size"])
        save_file({"loss": torch.tensor(losses, dtype=torch.float64),
                   "grad_norm": torch.tensor(norms, dtype=torch.float64),
                   **{"final." + n: p.detach().clone().contiguous()
                      for n, p in model.named_parameters()}},
                  os.path.join(out, "cpu_f64.safetensors"), metadata=meta)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"{sorted(os.listdir(os.path.join(out, 'hf')))}; loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}, grad norm {norms[0]:.3f} -> {norms[-1]:.3f}")


if __name__ == "__main__":
    main()

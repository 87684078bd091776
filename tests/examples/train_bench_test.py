#!/usr/bin/env python3
"""accrue_train --bench on the CPU (examples/train/train.cpp):
    train_bench_test.py TRAINER
prints exactly one JSON line with the keys bench/llama_bench.py reads (those
of accrue_train_gpt2 --bench), positive tokens/s, the FLOPs per token of Note
[Llama FLOPs per token], and the memory per rank; the same with one document
per row, activation checkpointing and --zero1 on one process; and for
gpt2-tiny, accrue_train_gpt2's configuration keys and its FLOPs per token
(Note [GPT-2 FLOPs per token])."""
import json
import subprocess
import sys

KEYS = ["bench", "device", "world_size", "tokens_per_s_median", "window_ms_median",
        "window_ms_min", "peak_memory_bytes", "device_memory_in_use_bytes", "mfu",
        "flops_per_token", "peak_flops", "final_loss", "store_memory_bytes", "config"]
BASE = ["--bench", "--synthetic", "--cpu", "--model", "llama-tiny", "--seq-len", "32",
        "--micro-batch", "2", "--accum", "2", "--bench-warmup", "1", "--bench-windows", "2"]


def flops_per_token(d, q, kv, f, layers, vocab, heads, head_dim, T):
    """The formula of Note [Llama FLOPs per token], written out again."""
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * f
    return 6 * (layers * per_layer + d * vocab) + 12 * layers * heads * head_dim * T


def gpt2_flops_per_token(c):
    """Note [GPT-2 FLOPs per token]: 6 N + 12 L T C, N without wpe and wte's padded rows."""
    C, L, V, T = c["n_embd"], c["n_layer"], c["vocab_size"], c["seq_len"]
    N = V * C + L * (12 * C * C + 13 * C) + 2 * C  # wte, blocks (weights, biases, norms), ln_f
    assert N == c["parameters"] - c["block_size"] * C - (-V % 128) * C, (N, c)
    return 6 * N + 12 * L * T * C


def llama_flops_per_token(c):
    return flops_per_token(c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"],
                           c["intermediate"], c["layers"], c["vocab_size"], c["heads"],
                           c["head_dim"], c["seq_len"])


def bench(trainer, extra, want_flops=llama_flops_per_token):
    run = subprocess.run([trainer] + BASE + extra, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (extra, run.returncode, run.stdout, run.stderr)
    lines = [l for l in run.stdout.splitlines() if l.startswith("{")]
    assert len(lines) == 1, (extra, run.stdout)
    j = json.loads(lines[0])
    assert list(j) == KEYS, (list(j), KEYS)
    assert j["bench"] == "accrue_train" and j["device"] == "CPU" and j["world_size"] == 1, j
    assert j["tokens_per_s_median"] > 0 and 0 < j["window_ms_min"] <= j["window_ms_median"], j
    assert j["peak_memory_bytes"] > 0 and j["device_memory_in_use_bytes"] is None, j
    assert j["mfu"] is None and j["peak_flops"] is None, j  # no peak known on the CPU
    assert j["final_loss"] > 0, j
    # tokens/s is the window's tokens over its median time
    assert abs(j["tokens_per_s_median"] - 128 / (j["window_ms_median"] / 1000)) <= \
        1e-4 * j["tokens_per_s_median"], j
    c = j["config"]
    assert (c["micro_batch"], c["seq_len"], c["micro_steps"], c["tokens_per_window"]) == \
        (2, 32, 2, 128), c
    assert (c["warmup_windows"], c["timed_windows"]) == (1, 2), c
    want = want_flops(c)
    assert abs(j["flops_per_token"] - want) <= 1e-5 * want, (j["flops_per_token"], want)
    m = j["store_memory_bytes"]
    assert m["total"] == m["master"] + m["grads"] + m["compute"] + m["moments"] > 0, m
    assert m["moments_sharded"] is False, m  # one process: nothing to shard over
    return j


def main():
    trainer = sys.argv[1]
    j = bench(trainer, [])
    c = j["config"]
    assert c["documents"] == "random" and c["activation_checkpointing"] is False, c
    assert c["zero1"] is False and c["cuda_graphs"] is False, c
    # llama-tiny: 2 layers, hidden 64, 4 / 2 heads of 16, SwiGLU 128, vocabulary 256.
    assert j["flops_per_token"] == 6 * (2 * 36864 + 64 * 256) + 12 * 2 * 64 * 32, j
    k = bench(trainer, ["--synthetic-documents", "full", "--activation-checkpointing", "--zero1"])
    c = k["config"]
    assert c["documents"] == "full" and c["activation_checkpointing"] is True, c
    assert c["zero1"] is True, c
    # GPT-2 (the later --model wins): accrue_train_gpt2's keys and FLOPs, full rows.
    g = bench(trainer, ["--model", "gpt2-tiny"], gpt2_flops_per_token)
    c = g["config"]
    assert c["model"] == "gpt2-tiny" and c["documents"] == "full", c
    assert (c["n_layer"], c["n_head"], c["n_embd"], c["vocab_size"], c["block_size"]) == \
        (2, 4, 64, 256, 64), c
    assert "layers" not in c and "hidden" not in c, c
    # accrue_train_gpt2 --bench on the same configuration counted 748032.
    assert g["flops_per_token"] == 748032, g
    print("ok: --bench prints one JSON line:", json.dumps(j)[:160], "...")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench/llama_bench.py and bench/torch_llama.py without a GPU.

Always: both scripts answer --help (no torch needed); the runner's --dry-run
plans every run of the default one-GPU points and of --nproc 2 with the
right options; bad command lines exit 2; the FLOPs per token equal
accrue_train's formula (Note [Llama FLOPs per token]) computed here from the
preset fields, and the parameter counts accrue's; --table-only turns known
rows into the expected ratios and PASS/MISS verdicts; the ncu breakdown
classes a stand-in ncu's kernels of the last window, the FP8 casts apart.

Where torch imports (this Python, or ACCRUE_TORCH_PYTHON): torch_llama.py
trains llama-tiny and qwen3-tiny on the CPU (and transformers' model where
transformers imports) and prints its JSON line, and its native model computes
transformers' logits from the same weights (1e-7 here: fp32 rotary tables;
dropping the llama3 scaling gives 6e-3); where ACCRUE_TRAIN_BIN names
a built accrue_train as well, the runner's --cpu mode measures both sides.
Those parts skip with a message otherwise.

    python3 tests/bench/llama_bench_test.py [REPO_ROOT]
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench")
RUNNER = os.path.join(BENCH, "llama_bench.py")
TORCH_LLAMA = os.path.join(BENCH, "torch_llama.py")
sys.path.insert(0, BENCH)
import torch_llama  # noqa: E402  (imports no torch at module level)


def run(cmd, python=sys.executable, timeout=300, env=None):
    return subprocess.run([python] + cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def torch_python():
    """A Python that imports torch, or None."""
    for python in (os.environ.get("ACCRUE_TORCH_PYTHON"), sys.executable):
        if python and subprocess.run([python, "-c", "import torch"], capture_output=True,
                                     timeout=120).returncode == 0:
            return python
    return None


class Help(unittest.TestCase):
    def test_both_scripts_answer_help(self):
        for script, words in ((RUNNER, ["--dry-run", "--nproc", "--skip-compile", "--resume"]),
                              (TORCH_LLAMA, ["--impl", "--compile", "--fsdp", "--device"])):
            p = run([script, "--help"])
            self.assertEqual(p.returncode, 0, p.stderr)
            for word in words:
                self.assertIn(word, p.stdout, script)

    def test_bad_command_lines_exit_2(self):
        for cmd in ([RUNNER, "--models", "gpt2", "--dry-run"],
                    [RUNNER, "--nproc", "0", "--dry-run"],
                    [RUNNER, "--resume"],
                    [TORCH_LLAMA, "--model", "llama-tiny", "--seq-len", "129"],
                    [TORCH_LLAMA, "--micro-batch", "3", "--global-batch", "8"]):
            p = run(cmd)
            self.assertEqual(p.returncode, 2, (cmd, p.stdout, p.stderr))
            self.assertIn("error:", p.stderr)
        p = run([RUNNER, "--points", "0x2", "--dry-run"])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("0x2", p.stderr)


class DryRun(unittest.TestCase):
    def plan(self, *extra):
        p = run([RUNNER, "--dry-run", "--accrue-bin", "/x/accrue_train"] + list(extra))
        self.assertEqual(p.returncode, 0, p.stderr)
        return [line for line in p.stdout.splitlines() if line.startswith("[llama_bench]")]

    def test_one_gpu_plan(self):
        lines = self.plan()
        points = {"llama-125m": [(32, 2), (8, 8), (2, 32), (1, 64)],
                  "llama3.2-1b": [(8, 4), (2, 16), (1, 32)]}
        self.assertEqual(len(lines), 4 * 7, "\n".join(lines))
        for model, pts in points.items():
            for b, k in pts:
                accrue = [x for x in lines if f"accrue_{model}_1gpu_{b}x{k}:" in x]
                self.assertEqual(len(accrue), 1)
                self.assertIn(f"/x/accrue_train --bench --synthetic --synthetic-documents full "
                              f"--model {model} --dtype bf16 --seq-len 2048 --micro-batch {b} "
                              f"--accum {k}", accrue[0])
                for impl, flag in (("torch_eager", None), ("torch_compile", "--compile"),
                                   ("transformers", "--impl transformers")):
                    row = [x for x in lines if f"{impl}_{model}_1gpu_{b}x{k}:" in x]
                    self.assertEqual(len(row), 1, impl)
                    self.assertIn(f"torch_llama.py --model {model} --micro-batch {b} --k {k} "
                                  f"--seq-len 2048", row[0])
                    if flag:
                        self.assertIn(flag, row[0])
                    else:
                        self.assertNotIn("--compile", row[0])
                        self.assertNotIn("--impl", row[0])
        self.assertEqual(len(self.plan("--skip-compile", "--skip-transformers")), 2 * 7)
        self.assertEqual(len(self.plan("--skip-torch")), 7)

    def test_two_gpu_plan(self):
        lines = self.plan("--nproc", "2")
        self.assertEqual(len(lines), 6 * 2, "\n".join(lines))
        for b, k in ((8, 4), (2, 16)):
            runs = {x.split(":")[0].split("] ")[1]: x for x in lines if f"_{b}x{k}:" in x}
            self.assertEqual(sorted(runs), sorted(
                f"{impl}_llama3.2-1b_{w}gpu_{b}x{k}" for impl, w in
                (("accrue", 1), ("accrue", 2), ("accrue_zero1", 2), ("torch", 1),
                 ("torch_ddp", 2), ("torch_fsdp", 2))))
            two = [runs[f"{i}_llama3.2-1b_2gpu_{b}x{k}"]
                   for i in ("accrue", "accrue_zero1", "torch_ddp", "torch_fsdp")]
            for line in two:
                self.assertIn("--nproc-per-node=2", line)
                self.assertIn("timeout --kill-after=60", line)
            self.assertIn("--no-python /x/accrue_train", two[0])
            self.assertIn(f"--micro-batch {b} --accum {k}", two[0])
            self.assertIn("--zero1", two[1])
            self.assertNotIn("--zero1", two[0])
            self.assertIn("--fsdp", two[3])
            self.assertNotIn("--nproc-per-node", runs[f"accrue_llama3.2-1b_1gpu_{b}x{k}"])
        self.assertEqual(len(self.plan("--nproc", "2", "--zero1-args", "", "--skip-fsdp")), 8)


class Arithmetic(unittest.TestCase):
    def test_flops_per_token_is_accrue_trains_formula(self):
        # accrue_train --bench printed 638976 for llama-tiny at T = 64 (CPU, this tree).
        self.assertEqual(torch_llama.flops_per_token("llama-tiny", 64), 638976)
        # 6 (L (d q + 2 d kv + q d + 3 d f) + d V) + 12 L q T, from the preset fields.
        for name, (L, d, h, kvh, hd, f, V) in {
                "llama-125m": (12, 768, 12, 4, 64, 2048, 32000),
                "llama3.2-1b": (16, 2048, 32, 8, 64, 8192, 128256),
                "qwen3-0.6b": (28, 1024, 16, 8, 128, 3072, 151936)}.items():
            q, kv, T = h * hd, kvh * hd, 2048
            want = 6 * (L * (d * q + 2 * d * kv + q * d + 3 * d * f) + d * V) + 12 * L * q * T
            self.assertEqual(torch_llama.flops_per_token(name, T), want, name)

    def test_parameter_counts_are_accrues(self):
        # nn/llama_config.h: llama-125m 124.7M, llama3.2-1b 1.24B (transformers' counts).
        self.assertEqual(round(torch_llama.parameter_count(torch_llama.PRESETS["llama-125m"])
                               / 1e5), 1247)
        self.assertEqual(round(torch_llama.parameter_count(torch_llama.PRESETS["llama3.2-1b"])
                               / 1e7), 124)
        # llama-tiny: accrue_train reports 106816 parameters.
        self.assertEqual(torch_llama.parameter_count(torch_llama.PRESETS["llama-tiny"]), 106816)


def row(impl, tok, gib, world=1, b=8, k=4, mfu=None, error=None):
    r = {"impl": impl, "label": impl, "model": "llama3.2-1b", "world_size": world,
         "micro_batch": b, "K": k, "tokens_per_s": tok, "peak_mem_gib": gib, "mfu": mfu,
         "raw": {"gpu": "NVIDIA H200"}}
    if error:
        r["error"] = error
    return r


class Tables(unittest.TestCase):
    def table(self, rows, *extra):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rows.json")
            with open(path, "w") as f:
                json.dump(rows, f)
            p = run([RUNNER, "--table-only", "--json", path, "--models", "llama3.2-1b"]
                    + list(extra))
        self.assertEqual(p.returncode, 0 if all(
            not r.get("error") for r in rows if r["impl"].startswith("accrue")) else 1, p.stderr)
        return p.stdout

    def test_one_gpu_verdicts(self):
        rows = [row("accrue", 140000, 30.0, mfu=0.55), row("torch_eager", 100000, 40.0),
                row("torch_compile", 130000, 35.0), row("transformers", 90000, 45.0),
                row("accrue", 100000, 20.0, b=2, k=16, mfu=0.4),
                row("torch_eager", 80000, 19.0, b=2, k=16),
                row("torch_compile", None, None, b=2, k=16, error="out of memory")]
        out = self.table(rows, "--points", "8x4,2x16")
        self.assertIn("| 8 x 4 | 140,000 | 100,000 | 130,000 | 90,000 | 1.40x | PASS | 1.08x "
                      "| MISS | 55.0% |", out)
        self.assertIn("| 30.00 | 40.00 | 35.00 | 45.00 | PASS |", out)
        self.assertIn("| 2 x 16 | 100,000 | 80,000 | OOM | not run | 1.25x | MISS "
                      "| ∞ (PyTorch OOM) | PASS (PyTorch OOM) |", out)
        self.assertIn("| 20.00 | 19.00 | – | – | MISS |", out)
        self.assertIn("MFU >= 50% at llama3.2-1b micro-batch 8 (K = 4): 55.0% PASS", out)
        self.assertIn("targets PASS: eager 1 of 2; compile 1 of 2; memory 1 of 2", out)

    def test_two_gpu_verdicts(self):
        rows = [row("accrue", 100000, 30.0), row("accrue", 196000, 31.0, world=2),
                row("accrue_zero1", 190000, 25.0, world=2), row("torch", 70000, 40.0),
                row("torch_ddp", 150000, 41.0, world=2),
                row("torch_fsdp", 170000, 33.0, world=2)]
        rows[1]["raw"]["store_memory_bytes"] = {"total": 3 * 2**30}
        rows[2]["raw"]["store_memory_bytes"] = {"total": 1.5 * 2**30}
        out = self.table(rows, "--nproc", "2", "--points", "8x4")
        self.assertIn("| 8 x 4 | 100,000 | 196,000 | 1.96x | PASS | 190,000 | 70,000 | 150,000 "
                      "| 170,000 | 1.31x | PASS | 1.15x | MISS |", out)
        self.assertIn("| 8 x 4 | 30.00 | 31.00 | 25.00 | 40.00 | 41.00 | 33.00 | 3.00 | 1.50 |",
                      out)

    def test_failed_accrue_run_is_a_miss_and_exit_1(self):
        rows = [row("accrue", None, None, error="exit 1: accrue_train: boom"),
                row("torch_eager", 100000, 40.0)]
        out = self.table(rows, "--points", "8x4", "--skip-compile")
        self.assertIn("| 8 x 4 | failed | 100,000 |", out)
        self.assertIn("MISS (accrue failed)", out)
        self.assertIn("exit 1: accrue_train: boom", out)


# A stand-in for ncu: the CSV ncu --csv --print-units base prints, two windows
# (each ends with the close's fused_optimizer_kernel), durations in ns.
FAKE_NCU = r"""#!/usr/bin/env python3
kernels = [("setup_kernel", 5), ("fused_optimizer_kernel<float>", 70),
           ("nvjet_tst_128x256", 100), ("rms_norm_kernel<bf16>", 50), ("rope_kernel", 20),
           ("swiglu_kernel", 30), ("cudnn_generated_sdpa_flash_fprop", 80),
           ("cross_entropy_rows_kernel", 40), ("mystery_kernel(int)", 10),
           ("fused_optimizer_kernel<float>", 70)]
print("==PROF== Connected to process")
print('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"')
for i, (name, ns) in enumerate(kernels):
    print(f'"{i}","{name}","gpu__time_duration.sum","nsecond","{ns}"')
"""


# Maps transformers' parameter names onto torch_llama's native model, perturbs
# the norms (ones at initialization), and prints max |logits difference| for
# llama-tiny, qwen3-tiny, and llama-tiny tied with llama3 rope scaling.
EQUIVALENCE = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import torch_llama as tl
torch.manual_seed(0)
scaled = dict(rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=16),
              tie_word_embeddings=True, rope_theta=500000.0)
for name, extra in (("llama-tiny", {}), ("qwen3-tiny", {}), ("llama-tiny", scaled)):
    c = dict(tl.PRESETS[name], **extra)
    T = 64
    hf = tl.build_transformers(c).double()
    nat = tl.build_native(torch, c, T).double()
    sd = hf.state_dict()
    names = {"tok_embeddings.weight": "model.embed_tokens.weight",
             "norm.weight": "model.norm.weight"}
    if not c["tie_word_embeddings"]:
        names["output.weight"] = "lm_head.weight"
    pairs = [("attention.wq", "self_attn.q_proj"), ("attention.wk", "self_attn.k_proj"),
             ("attention.wv", "self_attn.v_proj"), ("attention.wo", "self_attn.o_proj"),
             ("feed_forward.w1", "mlp.gate_proj"), ("feed_forward.w2", "mlp.down_proj"),
             ("feed_forward.w3", "mlp.up_proj"), ("attention_norm", "input_layernorm"),
             ("ffn_norm", "post_attention_layernorm")]
    if c["qk_norm"]:
        pairs += [("attention.q_norm", "self_attn.q_norm"),
                  ("attention.k_norm", "self_attn.k_norm")]
    for i in range(c["layers"]):
        for a, b in pairs:
            names[f"layers.{i}.{a}.weight"] = f"model.layers.{i}.{b}.weight"
    with torch.no_grad():
        for n, v in nat.named_parameters():
            if v.dim() == 1:
                sd[names[n]].add_(0.1 * torch.randn_like(v))
            v.copy_(sd[names[n]])
    assert len(names) == len(dict(nat.named_parameters())), "every parameter mapped"
    x = torch.randint(0, c["vocab_size"], (2, T))
    with torch.no_grad():
        print((hf(input_ids=x).logits - nat(x)).abs().max().item())
"""


class NcuBreakdown(unittest.TestCase):
    def breakdown(self, *args):
        """The runner with the stand-in ncu over llama-tiny: its process and --json rows."""
        with tempfile.TemporaryDirectory() as d:
            ncu = os.path.join(d, "ncu")
            with open(ncu, "w") as f:
                f.write(FAKE_NCU)
            os.chmod(ncu, 0o755)
            p = run([RUNNER, "--cpu", "--models", "llama-tiny", "--points", "", "--seq-len", "32",
                     "--ncu", ncu, "--json", os.path.join(d, "rows.json")] + list(args))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(os.path.join(d, "rows.json")) as f:
                return p, json.load(f)

    def test_classes_of_the_last_window(self):
        p, rows = self.breakdown("--ncu-points", "llama-tiny:2x2")
        self.assertIn("accrue llama-tiny at 2 x 2: kernel time by class over one window (the "
                      "last of 2 windows; 8 kernels, 0.00 ms", p.stdout)
        for line in ("| GEMM | 1 | 0.00 | 25.0% |", "| norms | 1 | 0.00 | 12.5% |",
                     "| RoPE | 1 | 0.00 | 5.0% |", "| SwiGLU | 1 | 0.00 | 7.5% |",
                     "| attention | 1 | 0.00 | 20.0% |", "| classifier | 1 | 0.00 | 10.0% |",
                     "| window close | 1 | 0.00 | 17.5% |", "| other | 1 | 0.00 | 2.5% |",
                     "largest kernels in 'other': mystery_kernel"):
            self.assertIn(line, p.stdout)
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0]["impl"], "ncu")
        self.assertEqual(rows[0]["breakdown"]["classes"]["GEMM"]["ns"], 100)

    def test_fp8_casts_are_a_class_of_their_own(self):
        import llama_bench as lb  # bench/ is on the path; it imports no torch
        for name in ("void accrue::kernels::cuda::(anonymous namespace)::"
                     "cast_blockwise_segments_kernel<__nv_bfloat16, unsigned char, 1>(...)",
                     "cast_transpose_packed_kernel", "cast_to_fp8_kernel", "scale_rule_kernel"):
            self.assertEqual(lb.classify(name), "FP8 casts", name)
        self.assertEqual(lb.classify("map_contiguous_kernel<cast>"), "elementwise")
        self.assertEqual(lb.classify("nvjet_sm90_tst_128x128_64x4_e4m3"), "GEMM")
        import gpt2_bench  # GPT-2's breakdown shares the class
        self.assertEqual(gpt2_bench.classify("cast_transpose_packed_kernel"), "FP8 casts")

    def test_a_large_k_is_profiled_over_fewer_micro_batches_and_says_so(self):
        p, rows = self.breakdown("--ncu-points", "llama-tiny:2x8", "--ncu-max-k", "2")
        self.assertIn("accrue llama-tiny at 2 x 8: kernel time by class", p.stdout)
        self.assertIn("a window of 2 micro-batches, not 8 (--ncu-max-k)", p.stdout)
        cmd = rows[0]["cmd"]
        self.assertEqual(cmd[cmd.index("--accum") + 1], "2")
        self.assertEqual((rows[0]["K"], rows[0]["profiled_K"]), (8, 2))
        # Note [Profiled span]: ncu records the one timed window, after one warm-up.
        self.assertEqual(cmd[1:3], ["--profile-from-start", "off"])
        self.assertEqual(cmd[cmd.index("--bench-warmup") + 1], "1")
        self.assertEqual(cmd[cmd.index("--bench-windows") + 1], "1")


    def test_a_timed_window_alone_is_every_kernel_profiled(self):
        # Note [Profiled span]: the close's kernels after its optimizer kernel are the window's too.
        import gpt2_bench
        kernels = [("nvjet_tst", 100), ("fused_optimizer_kernel<float>", 70), ("loss_sum", 5)]
        self.assertEqual(gpt2_bench.last_window(kernels, timed_only=True),
                         (kernels, "the timed window alone: ncu --profile-from-start off"))
        self.assertEqual(gpt2_bench.last_window(kernels)[1],
                         "one window found: set-up kernels included")


class TorchOnCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.python = torch_python()

    def setUp(self):
        if self.python is None:
            self.skipTest("torch does not import (set ACCRUE_TORCH_PYTHON): the CPU runs are "
                          "not tested")

    def line(self, *args):
        p = run([TORCH_LLAMA, "--device", "cpu", "--seq-len", "32", "--micro-batch", "2",
                 "--k", "2", "--warmup", "1", "--windows", "2"] + list(args),
                python=self.python)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

    def check(self, d, model, impl):
        c = torch_llama.PRESETS[model]
        self.assertEqual(d["model"], model)
        self.assertEqual(d["impl"], impl)
        self.assertEqual((d["micro_batch"], d["K"], d["seq_len"], d["world_size"]), (2, 2, 32, 1))
        self.assertEqual(d["tokens_per_window"], 2 * 2 * 32)
        self.assertGreater(d["tokens_per_s"], 0)
        self.assertEqual(d["tokens_per_s_median"], d["tokens_per_s"])
        self.assertEqual(d["params"], torch_llama.parameter_count(c))
        self.assertEqual(d["flops_per_token"], torch_llama.flops_per_token(model, 32))
        self.assertTrue(math.isfinite(d["loss"]))
        # Random tokens over V ids: the first windows' loss is near ln V.
        self.assertLess(abs(d["loss"] - math.log(c["vocab_size"])), 1.0)
        self.assertIsNone(d["peak_memory_bytes"])  # no allocator figure on the CPU

    def test_native_models(self):
        for model in ("llama-tiny", "qwen3-tiny"):
            self.check(self.line("--model", model), model, "pytorch")

    def test_transformers_model(self):
        if subprocess.run([self.python, "-c", "import transformers"],
                          capture_output=True).returncode != 0:
            self.skipTest("transformers does not import")
        for model in ("llama-tiny", "qwen3-tiny"):
            self.check(self.line("--model", model, "--impl", "transformers"), model,
                       "transformers")

    def test_native_model_equals_transformers(self):
        """The native model computes transformers' logits from the same weights (f64; the
        rotary tables are fp32 on both sides), GQA, QK-norm, tied heads and llama3 scaling."""
        if subprocess.run([self.python, "-c", "import transformers"],
                          capture_output=True).returncode != 0:
            self.skipTest("transformers does not import")
        p = subprocess.run([self.python, "-c", EQUIVALENCE, BENCH], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        diffs = [float(x) for x in p.stdout.split()]
        self.assertEqual(len(diffs), 3, p.stdout)
        for d in diffs:
            self.assertLess(d, 1e-5)

    def test_runner_on_cpu(self):
        accrue = os.environ.get("ACCRUE_TRAIN_BIN")
        if not accrue or not os.access(accrue, os.X_OK):
            self.skipTest("ACCRUE_TRAIN_BIN names no accrue_train: the runner's --cpu mode is "
                          "not tested")
        with tempfile.TemporaryDirectory() as d:
            p = run([RUNNER, "--cpu", "--accrue-bin", accrue, "--python", self.python,
                     "--models", "llama-tiny", "--points", "2x2", "--seq-len", "32",
                     "--warmup", "1", "--windows", "2", "--skip-compile", "--skip-transformers",
                     "--json", os.path.join(d, "rows.json")])
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
            with open(os.path.join(d, "rows.json")) as f:
                rows = json.load(f)
        self.assertEqual(sorted(r["impl"] for r in rows), ["accrue", "torch_eager"])
        for r in rows:
            self.assertNotIn("error", r)
            self.assertGreater(r["tokens_per_s"], 0)
        accrue_raw = next(r for r in rows if r["impl"] == "accrue")["raw"]
        self.assertEqual(accrue_raw["flops_per_token"],
                         torch_llama.flops_per_token("llama-tiny", 32))
        self.assertRegex(p.stdout,
                         r"\| 2 x 2 \| [\d,]+ \| [\d,]+ \| not run \| not run \| [\d.]+x \|")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)

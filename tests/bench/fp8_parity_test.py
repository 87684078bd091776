#!/usr/bin/env python3
"""bench/fp8_parity.py without a GPU.

Always: --help, bad command lines exit 2, and --dry-run plans every run with
the same arguments but the recipe's (the Llama models with the EOS id, GPT-2
without). Where ACCRUE_TRAIN_BIN names a built accrue_train: the whole script
on the CPU with gpt2-tiny over a few of the repository's files (the shards
written, every recipe run, the verdicts and parity.json); skipped with a
message otherwise.

    python3 tests/bench/fp8_parity_test.py [REPO_ROOT]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "fp8_parity.py")


def run(args, timeout=300):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          timeout=timeout)


class Fp8Parity(unittest.TestCase):
    def test_help(self):
        r = run(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--recipes", r.stdout)

    def test_bad_command_lines(self):
        for bad in (["--models", "gpt5", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--recipes", "fp4", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--gpus", "", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--windows", "0", "--accrue-bin", "x", "--out-dir", "/tmp/x"]):
            r = run(bad)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("error", r.stderr)

    def test_dry_run_plans_the_same_runs_but_the_recipe(self):
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12,llama-125m",
                     "--recipes", "tensor,block", "--windows", "2000", "--text-dir",
                     os.path.join(ROOT, "bench"), "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        plans = {}
        for line in r.stdout.splitlines():
            if ": accrue" in line:
                name, cmd = line.split(": ", 1)
                words = cmd.split()
                # Each run its own metrics file, named after it.
                self.assertEqual(words[words.index("--metrics") + 1],
                                 os.path.join(out, name + ".jsonl"))
                del words[words.index("--metrics"):words.index("--metrics") + 2]
                plans[name] = " ".join(words)
        self.assertEqual(sorted(plans), sorted(f"{m}_{rec}" for m in ("gpt2-d12", "llama-125m")
                                               for rec in ("bf16", "tensor", "block")))
        for model in ("gpt2-d12", "llama-125m"):
            base = plans[f"{model}_bf16"].split()
            self.assertIn("--cuda-graphs", base)
            self.assertEqual("--eos-id" in base, model == "llama-125m")
            self.assertEqual(base[base.index("--windows") + 1], "2000")
            for recipe in ("tensor", "block"):
                self.assertEqual(plans[f"{model}_{recipe}"].split(),
                                 base + ["--fp8", "--fp8-recipe", recipe])

    def test_the_script_on_the_cpu(self):
        binary = os.environ.get("ACCRUE_TRAIN_BIN")
        if not binary or not os.path.exists(binary):
            self.skipTest("ACCRUE_TRAIN_BIN does not name a built accrue_train")
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", binary, "--models", "gpt2-tiny", "--windows", "6",
                     "--val-every", "3", "--val-batches", "2", "--text-dir",
                     os.path.join(ROOT, "bench"), "--cpu", "--out-dir", out], timeout=280)
            self.assertIn(r.returncode, (0, 1), r.stdout + r.stderr)
            with open(os.path.join(out, "parity.json")) as f:
                results = json.load(f)["results"]
        self.assertEqual([x["recipe"] for x in results], ["bf16", "tensor", "block"])
        for x in results:
            self.assertEqual(x["rc"], 0, x)
            self.assertEqual(x["windows"], 6)
            self.assertGreater(x["final_val_loss"], 0)
        self.assertEqual(results[0]["verdict"], "reference")
        for x in results[1:]:
            ratio = x["final_val_loss"] / results[0]["final_val_loss"]
            self.assertAlmostEqual(x["ratio_to_bf16"], ratio, places=12)
            self.assertEqual(x["verdict"], "PASS" if abs(ratio - 1) <= 0.005 else "MISS")
        self.assertEqual(r.returncode, 0 if all(x["verdict"] != "MISS" for x in results) else 1)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)

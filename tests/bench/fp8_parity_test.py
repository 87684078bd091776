#!/usr/bin/env python3
"""bench/fp8_parity.py without a GPU.

Always: --help, bad command lines exit 2, --dry-run plans every run with
the same arguments but the recipe's and the seed's (the Llama models with the
EOS id, GPT-2 without; several --seeds name the runs _sSEED), a data line
naming every --text-dir root, and text_files on a temporary tree (site-packages
below a root left out, a root named site-packages kept, several roots joined
in order without repeats), a --gpus index the machine lacks refused, and
which earlier runs --reuse takes (whole runs of the same identity only), and
the per-seed ratios to bf16 (paired_ratios).
Where ACCRUE_TRAIN_BIN names a built accrue_train: the whole script on the
CPU with gpt2-tiny over a few of the repository's files (the shards written,
every recipe run, the verdicts and parity.json), and a sweep that reuses an
earlier one's runs; skipped with a message otherwise.

    python3 tests/bench/fp8_parity_test.py [REPO_ROOT]
"""
import glob
import importlib.util
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


def plans_of(stdout, out):
    """{run name: its command without --metrics} from a dry run's output."""
    plans = {}
    for line in stdout.splitlines():
        if ": accrue" in line:
            name, cmd = line.split(": ", 1)
            words = cmd.split()
            # Each run its own metrics file, named after it.
            assert words[words.index("--metrics") + 1] == os.path.join(out, name + ".jsonl"), line
            del words[words.index("--metrics"):words.index("--metrics") + 2]
            plans[name] = words
    return plans


class Fp8Parity(unittest.TestCase):
    def test_help(self):
        r = run(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--recipes", r.stdout)

    def test_bad_command_lines(self):
        for bad in (["--models", "gpt5", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--recipes", "fp4", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--gpus", "", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--windows", "0", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--seeds", "x", "--accrue-bin", "x", "--out-dir", "/tmp/x"],
                    ["--seeds", "", "--accrue-bin", "x", "--out-dir", "/tmp/x"]):
            r = run(bad)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("error", r.stderr)

    def test_gpus_the_machine_lacks_are_refused(self):
        # A fake nvidia-smi that lists one GPU: --gpus 0,1 names a GPU that is not there.
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "nvidia-smi")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
            os.chmod(fake, 0o755)
            env = dict(os.environ, PATH=d + os.pathsep + os.environ.get("PATH", ""))
            r = subprocess.run([sys.executable, SCRIPT, "--accrue-bin", "x", "--gpus", "0,1",
                                "--out-dir", os.path.join(d, "out")], capture_output=True,
                               text=True, timeout=60, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("GPU '1' is not one of this machine's 1 (0 to 0)", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "out")))  # refused before any work

    def test_dry_run_plans_the_same_runs_but_the_recipe(self):
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12,llama-125m",
                     "--recipes", "tensor,block", "--windows", "2000", "--text-dir",
                     os.path.join(ROOT, "bench"), "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        plans = plans_of(r.stdout, out)
        self.assertEqual(sorted(plans), sorted(f"{m}_{rec}" for m in ("gpt2-d12", "llama-125m")
                                               for rec in ("bf16", "tensor", "block")))
        for model in ("gpt2-d12", "llama-125m"):
            base = plans[f"{model}_bf16"]
            self.assertIn("--cuda-graphs", base)
            self.assertNotIn("--eos-id", base)  # every model reads contiguous rows
            self.assertEqual("--contiguous-rows" in base, model == "llama-125m")
            self.assertEqual(base[base.index("--windows") + 1], "2000")
            self.assertEqual(base[base.index("--seed") + 1], "1")
            for recipe in ("tensor", "block"):
                self.assertEqual(plans[f"{model}_{recipe}"],
                                 base + ["--fp8", "--fp8-recipe", recipe])

    def test_packed_llama_documents_take_the_eos_id(self):
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12,llama-125m",
                     "--llama-documents", "packed", "--text-dir", os.path.join(ROOT, "bench"),
                     "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        plans = plans_of(r.stdout, out)
        llama, gpt2 = plans["llama-125m_bf16"], plans["gpt2-d12_bf16"]
        self.assertEqual(llama[llama.index("--eos-id") + 1], "256")
        self.assertNotIn("--contiguous-rows", llama)
        self.assertNotIn("--eos-id", gpt2)

    def test_dry_run_with_two_seeds(self):
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12,llama-125m",
                     "--seeds", "1,2", "--text-dir", os.path.join(ROOT, "bench"),
                     "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        plans = plans_of(r.stdout, out)
        self.assertEqual(sorted(plans), sorted(f"{m}_{rec}_s{s}" for m in ("gpt2-d12", "llama-125m")
                                               for rec in ("bf16", "tensor", "block")
                                               for s in (1, 2)))
        for model in ("gpt2-d12", "llama-125m"):
            for recipe in ("bf16", "tensor", "block"):
                one, two = plans[f"{model}_{recipe}_s1"], plans[f"{model}_{recipe}_s2"]
                i = one.index("--seed")
                self.assertEqual(one[i + 1], "1")
                # The same command but the seed's value.
                self.assertEqual(two, one[:i + 1] + ["2"] + one[i + 2:])

    def test_a_single_other_seed_is_named(self):
        # Seed 2 alone into the directory of a seed-1 run must not take (and overwrite) its names.
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12", "--recipes", "bf16",
                     "--seeds", "2", "--text-dir", os.path.join(ROOT, "bench"),
                     "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(plans_of(r.stdout, out)), ["gpt2-d12_bf16_s2"])

    def test_dry_run_names_every_text_dir(self):
        dirs = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "tools")]
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", "accrue_train", "--models", "gpt2-d12", "--text-dir",
                     ",".join(dirs), "--out-dir", out, "--dry-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        data = [line for line in r.stdout.splitlines() if line.startswith("data:")]
        self.assertEqual(len(data), 1, r.stdout)
        for d in dirs:
            self.assertIn(d, data[0])

    def test_text_files(self):
        spec = importlib.util.spec_from_file_location("fp8_parity", SCRIPT)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        with tempfile.TemporaryDirectory() as tmp:
            def touch(*parts):
                path = os.path.join(tmp, *parts)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write("x = 1\n")
                return path

            src = os.path.join(tmp, "src")
            site = os.path.join(tmp, "lib", "site-packages")
            a, b = touch("src", "a.py"), touch("src", "sub", "b.py")
            touch("src", "vendor", "site-packages", "v.py")  # vendored below a root: left out
            touch("src", "notes.txt")
            c = touch("lib", "site-packages", "c.py")
            d = touch("lib", "site-packages", "pkg", "d.py")
            self.assertEqual(parity.text_files([src]), [a, b])
            self.assertEqual(parity.text_files([site]), [c, d])
            self.assertEqual(parity.text_files([src, site]), [a, b, c, d])
            self.assertEqual(parity.text_files([site, src]), [c, d, a, b])
            # A root twice, or one inside another, gives its files once, where first reached.
            self.assertEqual(parity.text_files([src, site, src]), [a, b, c, d])
            self.assertEqual(parity.text_files([os.path.join(src, "sub"), src]), [b, a])

    def test_paired_ratios_divide_seed_by_seed(self):
        spec = importlib.util.spec_from_file_location("fp8_parity", SCRIPT)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        # The tenth session's GPT-2 124M figures: tensor below bf16 at both seeds.
        self.assertEqual([round(x, 4) for x in
                          parity.paired_ratios([2.2544, 2.3181], [2.3007, 2.3751])],
                         [0.9799, 0.976])
        # A run without a figure pairs with nothing, and neither does a missing bf16.
        self.assertEqual(parity.paired_ratios([None, 2.0], [2.0, None]), [None, None])
        self.assertEqual(parity.paired_ratios([3.0, 1.0], [2.0, 4.0]), [1.5, 0.25])

    def test_shards_follow_the_text_dirs(self):
        spec = importlib.util.spec_from_file_location("fp8_parity", SCRIPT)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        with tempfile.TemporaryDirectory() as tmp:
            def shard_bytes(out):
                return sum(os.path.getsize(f)
                           for f in glob.glob(os.path.join(out, "data", "text_*.bin")))

            def shard_times(out):
                return sorted(os.stat(f).st_mtime_ns
                              for f in glob.glob(os.path.join(out, "data", "text_*.bin")))

            out = os.path.join(tmp, "out")
            one = parity.parse_args(["--accrue-bin", "x", "--out-dir", out,
                                     "--text-dir", os.path.join(ROOT, "tools")])
            parity.make_data(one)
            first, times = shard_bytes(out), shard_times(out)
            self.assertGreater(first, 0)
            parity.make_data(one)  # the same roots: the shards are kept
            self.assertEqual(shard_times(out), times)
            # Other roots in the same output directory: the shards are written again.
            two = parity.parse_args(["--accrue-bin", "x", "--out-dir", out, "--text-dir",
                                     os.path.join(ROOT, "tools") + "," +
                                     os.path.join(ROOT, "bench")])
            parity.make_data(two)
            self.assertGreater(shard_bytes(out), first)

    def test_shuffled_files_are_a_fixed_permutation(self):
        spec = importlib.util.spec_from_file_location("fp8_parity", SCRIPT)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        roots = os.path.join(ROOT, "tools") + "," + os.path.join(ROOT, "bench")
        with tempfile.TemporaryDirectory() as tmp:
            def files_of(*extra):
                out = os.path.join(tmp, "out")
                args = parity.parse_args(["--accrue-bin", "x", "--out-dir", out,
                                          "--text-dir", roots, *extra])
                parity.make_data(args)
                with open(os.path.join(out, "data", "text_sources.json")) as f:
                    return json.load(f)["files"]

            plain = files_of()
            one = files_of("--shuffle-files", "1")
            self.assertEqual(sorted(one), sorted(plain))  # the same files
            self.assertNotEqual(one, plain)               # in another order
            self.assertEqual(files_of("--shuffle-files", "1"), one)  # the same one again
            self.assertNotEqual(files_of("--shuffle-files", "2"), one)

    def test_reuse_takes_only_whole_runs_of_the_same_identity(self):
        spec = importlib.util.spec_from_file_location("fp8_parity", SCRIPT)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        cmd = ["/a/accrue_train", "--model", "gpt2-d12", "--train-data", "/a/data/t_*.bin",
               "--val-data", "/a/data/v_*.bin", "--windows", "3", "--metrics", "/a/r.jsonl"]
        moved = ["/b/accrue_train"] + cmd[1:]
        for flag, path in (("--train-data", "/b/t"), ("--val-data", "/b/v"),
                           ("--metrics", "/b/r.jsonl")):
            moved[moved.index(flag) + 1] = path
        ident = parity.identity(cmd, "d1")
        self.assertEqual(parity.identity(moved, "d1"), ident)  # paths are not the run
        self.assertNotEqual(parity.identity(cmd, "d2"), ident)  # other shards are
        other = list(cmd)
        other[other.index("--windows") + 1] = "4"
        self.assertNotEqual(parity.identity(other, "d1"), ident)
        with tempfile.TemporaryDirectory() as tmp:
            def write(name, rows, ident_of=ident, partial=""):
                with open(os.path.join(tmp, name + ".run.json"), "w") as f:
                    json.dump(ident_of, f)
                with open(os.path.join(tmp, name + ".jsonl"), "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                    f.write(partial)

            whole = [{"window": 1, "loss": 3.0}, {"window": 2, "loss": 2.0},
                     {"window": 3, "loss": 1.5, "val_loss": 1.7}]
            write("whole", whole)
            write("short", whole[:2])
            write("no_val", whole[:2] + [{"window": 3, "loss": 1.5}])
            write("cut", whole[:2], partial='{"window": 3, "lo')
            write("other", whole, ident_of=parity.identity(other, "d1"))
            with open(os.path.join(tmp, "no_record.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in whole)
            self.assertEqual(parity.finished_run(tmp, "whole", ident, 3),
                             os.path.join(tmp, "whole.jsonl"))
            for name in ("short", "no_val", "cut", "other", "no_record", "absent"):
                self.assertIsNone(parity.finished_run(tmp, name, ident, 3), name)
            self.assertIsNone(parity.finished_run(tmp, "whole", ident, 4))
            # take_reused copies the run's files into --out-dir.
            out = os.path.join(tmp, "out")
            os.makedirs(out)
            args = parity.parse_args(["--accrue-bin", "x", "--out-dir", out, "--windows", "3",
                                      "--reuse", os.path.join(tmp, "nothing") + "," + tmp])
            self.assertEqual(parity.take_reused(args, "whole", ident), tmp)
            with open(os.path.join(out, "whole.jsonl")) as f:
                self.assertEqual([json.loads(x) for x in f], whole)
            self.assertTrue(os.path.exists(os.path.join(out, "whole.run.json")))
            self.assertIsNone(parity.take_reused(args, "short", ident))
            self.assertFalse(os.path.exists(os.path.join(out, "short.jsonl")))

    def test_a_sweep_reuses_an_earlier_ones_runs_on_the_cpu(self):
        binary = os.environ.get("ACCRUE_TRAIN_BIN")
        if not binary or not os.path.exists(binary):
            self.skipTest("ACCRUE_TRAIN_BIN does not name a built accrue_train")
        common = ["--accrue-bin", binary, "--models", "gpt2-tiny", "--val-every", "2",
                  "--val-batches", "1", "--text-dir", os.path.join(ROOT, "bench"), "--cpu"]
        with tempfile.TemporaryDirectory() as tmp:
            first, second, third = (os.path.join(tmp, d) for d in ("first", "second", "third"))
            r = run(common + ["--windows", "3", "--recipes", "bf16,tensor", "--out-dir", first],
                    timeout=200)
            self.assertIn(r.returncode, (0, 1), r.stdout + r.stderr)
            # bf16 and tensor from the first sweep; delayed alone runs.
            r = run(common + ["--windows", "3", "--recipes", "bf16,tensor,delayed",
                              "--out-dir", second, "--reuse", first], timeout=200)
            self.assertIn(r.returncode, (0, 1), r.stdout + r.stderr)
            self.assertIn(f"reuse gpt2-tiny_bf16 from {first}", r.stdout)
            self.assertIn(f"reuse gpt2-tiny_tensor from {first}", r.stdout)
            self.assertEqual([x for x in r.stdout.splitlines() if x.startswith("start")],
                             ["start gpt2-tiny_delayed on GPU 0"])
            for recipe in ("bf16", "tensor"):
                with open(os.path.join(first, f"gpt2-tiny_{recipe}.jsonl")) as a, \
                        open(os.path.join(second, f"gpt2-tiny_{recipe}.jsonl")) as b:
                    self.assertEqual(a.read(), b.read())
            with open(os.path.join(second, "parity.json")) as f:
                parity = json.load(f)
            self.assertEqual(parity["reused"], {"gpt2-tiny_bf16": first,
                                                "gpt2-tiny_tensor": first})
            self.assertEqual([x["rc"] for x in parity["results"]], [0, 0, 0])
            # Another window count is another run: nothing is taken.
            r = run(common + ["--windows", "4", "--recipes", "bf16", "--out-dir", third,
                              "--reuse", first], timeout=200)
            self.assertIn(r.returncode, (0, 1), r.stdout + r.stderr)
            self.assertNotIn("reuse", r.stdout)
            self.assertIn("start gpt2-tiny_bf16 on GPU 0", r.stdout)

    def test_the_script_on_the_cpu(self):
        binary = os.environ.get("ACCRUE_TRAIN_BIN")
        if not binary or not os.path.exists(binary):
            self.skipTest("ACCRUE_TRAIN_BIN does not name a built accrue_train")
        with tempfile.TemporaryDirectory() as out:
            r = run(["--accrue-bin", binary, "--models", "gpt2-tiny", "--windows", "6",
                     "--recipes", "bf16,tensor,block,delayed,tensor-e4m3", "--val-every", "3",
                     "--val-batches", "2", "--text-dir", os.path.join(ROOT, "bench"), "--cpu",
                     "--out-dir", out], timeout=280)
            self.assertIn(r.returncode, (0, 1), r.stdout + r.stderr)
            with open(os.path.join(out, "parity.json")) as f:
                parity = json.load(f)
            # One seed: the run names of before.
            for recipe in ("bf16", "tensor", "block", "delayed", "tensor-e4m3"):
                self.assertTrue(os.path.exists(os.path.join(out, f"gpt2-tiny_{recipe}.jsonl")))
        results = parity["results"]
        self.assertEqual(parity["seeds"], [1])
        self.assertEqual(parity["text_dirs"], [os.path.join(ROOT, "bench")])
        self.assertEqual([x["recipe"] for x in results],
                         ["bf16", "tensor", "block", "delayed", "tensor-e4m3"])
        for x in results:
            self.assertEqual(x["rc"], 0, x)
            self.assertEqual(x["rcs"], [0], x)
            self.assertEqual(x["windows"], 6)
            self.assertGreater(x["final_val_loss"], 0)
            self.assertEqual(x["final_val_losses"], [x["final_val_loss"]])
            self.assertIsNone(x["seed_spread"])
            self.assertIsNone(x["within_bf16_seed_spread"])
        self.assertEqual(results[0]["verdict"], "reference")
        for x in results[1:]:
            ratio = x["final_val_loss"] / results[0]["final_val_loss"]
            self.assertAlmostEqual(x["ratio_to_bf16"], ratio, places=12)
            self.assertEqual(len(x["ratios_to_bf16_per_seed"]), 1)
            self.assertAlmostEqual(x["ratios_to_bf16_per_seed"][0], ratio, places=12)
            self.assertEqual(x["verdict"], "PASS" if abs(ratio - 1) <= 0.005 else "MISS")
        self.assertEqual(r.returncode, 0 if all(x["verdict"] != "MISS" for x in results) else 1)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)

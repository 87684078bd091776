#!/usr/bin/env python3
"""bench/gpt2_dp_bench.py without a GPU: --help, the --dry-run plan, and the
tables from known rows (the 2 / 1 ratios, peak memory, and the reducer's
timing line that accrue_train_gpt2 --bench prints under data parallelism).

    python3 tests/bench/gpt2_dp_bench_test.py [REPO_ROOT]
"""
import argparse
import os
import subprocess
import sys
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench")
SCRIPT = os.path.join(BENCH, "gpt2_dp_bench.py")
sys.path.insert(0, BENCH)
import gpt2_dp_bench  # noqa: E402  (imports no torch)


def accrue_row(world, b, k, tokens_per_s, peak_gib, reducer=None):
    raw = {"tokens_per_s_median": tokens_per_s, "peak_memory_bytes": int(peak_gib * 2**30)}
    if reducer:
        raw["reducer_last_backward_ms"], raw["reducer_close_waited_ms"] = reducer
    row = {"impl": "accrue", "label": f"accrue {world} GPU", "world_size": world,
           "micro_batch": b, "K": k, "raw": raw}
    row.update(gpt2_dp_bench.normalize(raw))
    return row


class DpBenchTest(unittest.TestCase):
    def test_help_and_dry_run(self):
        r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--accrue-args", r.stdout)
        r = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--skip-torch",
                            "--accrue-bin", "/bin/true"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("accrue_2gpu_8x4", r.stdout)
        self.assertIn("--total-batch-tokens", r.stdout)

    def test_tables_from_known_rows(self):
        # The seventeenth session's call 1 (2 x NVIDIA H200), with made-up reducer timings.
        rows = [accrue_row(1, 8, 4, 512810, 5.21), accrue_row(2, 8, 4, 989616, 5.21, (9.87, 0.012)),
                accrue_row(1, 4, 8, 454489, 3.67), accrue_row(2, 4, 8, 887348, 3.67, (5.5, 0.25))]
        args = argparse.Namespace(nproc=2, points=[(8, 4), (4, 8)])
        text = "\n".join(gpt2_dp_bench.tables(rows, args, "NVIDIA H200"))
        self.assertIn("| 8 x 4 | 512,810 | 989,616 | 1.93x |", text)
        self.assertIn("| 4 x 8 | 454,489 | 887,348 | 1.95x |", text)
        self.assertIn("| 8 x 4 | 5.21 | 5.21 |", text)
        self.assertIn("8 x 4: last backward 9.87 ms, the close waited 0.012 ms; "
                      "4 x 8: last backward 5.50 ms, the close waited 0.250 ms", text)

    def test_no_timing_line_without_the_fields(self):
        rows = [accrue_row(1, 8, 4, 500000, 5.0), accrue_row(2, 8, 4, 950000, 5.0)]
        args = argparse.Namespace(nproc=2, points=[(8, 4)])
        text = "\n".join(gpt2_dp_bench.tables(rows, args, "GPU"))
        self.assertNotIn("last backward", text)
        self.assertIn("this machine's GPUs are not H200s", text)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])

#!/usr/bin/env python3
"""bench/resnet_bench.py without a GPU: --help, and the table's verdicts from
known rows (the per-point targets of SPEEDUP_TARGETS: 1.1x at 256 x 1 and
64 x 4, 3x at 32 x 8 and 8 x 32; a ratio a hair under its target is a miss, printed to
three decimals; peak memory and torch.compile).

    python3 tests/bench/resnet_bench_test.py [REPO_ROOT]
"""
import argparse
import os
import subprocess
import sys
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)
import resnet_bench  # noqa: E402  (imports no torch)

GIB = 1024.0 ** 3


def row(impl, b, k, images_per_s, peak_gib):
    return {"impl": impl, "B": b, "K": k, "images_per_s": images_per_s, "peak_gib": peak_gib}


class TableTest(unittest.TestCase):
    def test_help(self):
        r = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"), "--help"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--accrue-args", r.stdout)

    def test_targets_per_point(self):
        # The seventeenth session's call 4 (NVIDIA H200).
        rows = [row("accrue", 32, 8, 4225, 1.75), row("eager", 32, 8, 1557, 1.77),
                row("accrue", 8, 32, 2651, 0.74), row("eager", 8, 32, 412, 0.76),
                row("accrue", 64, 4, 4665, 3.10), row("eager", 64, 4, 3536, 3.12),
                row("compile", 64, 4, 3691, 3.1),
                row("accrue", 256, 1, 5133, 11.09), row("eager", 256, 1, 4676, 11.15)]
        args = argparse.Namespace(model="resnet50", image_size=224,
                                  points=[(32, 8), (8, 32), (64, 4), (256, 1)],
                                  compile_points=[(64, 4)])
        text = resnet_bench.table(rows, args, "NVIDIA H200")
        self.assertIn("targets: 7 of 9 met", text)
        self.assertIn("MISSED: 32x8 accrue / eager 2.714 (>= 3.0)", text)
        self.assertIn("met: 8x32 accrue / eager 6.434 (>= 3.0)", text)
        self.assertIn("met: 64x4 accrue / eager 1.319 (>= 1.1)", text)
        self.assertIn("met: 64x4 accrue / torch.compile 1.264 (>= 1)", text)
        # 1.0977: a miss, not rounded up to 1.10.
        self.assertIn("MISSED: 256x1 accrue / eager 1.098 (>= 1.1)", text)
        self.assertIn("| 256 x 1 | 5,133 | 4,676 | 1.098 | >= 1.1x: MISSED |", text)
        self.assertIn("met: 256x1 peak memory 11.09 <= 11.15 GiB", text)

    def test_other_points_want_parity_and_missing_runs_are_not_measured(self):
        rows = [row("accrue", 16, 16, 3000, 1.0), row("eager", 16, 16, 2900, 1.1),
                row("accrue", 128, 2, 4000, 6.0)]
        args = argparse.Namespace(model="resnet50", image_size=224, points=[(16, 16), (128, 2)],
                                  compile_points=[])
        text = resnet_bench.table(rows, args, "GPU")
        self.assertIn("met: 16x16 accrue / eager 1.034 (>= 1.0)", text)
        self.assertIn("not measured: 128x2 accrue / eager –", text)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])

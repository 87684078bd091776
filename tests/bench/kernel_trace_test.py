#!/usr/bin/env python3
"""bench/kernel_trace.py without a GPU: --help, bad command lines exit 2, the
per-window figures from a small Chrome trace (two streams, an overlap, a gap,
the close exposed in place and under the forward),
where the tracer waits for the device, and, where torch does not import, the
refusal that says so.

    python3 tests/bench/kernel_trace_test.py [REPO_ROOT]
"""
import importlib.util
import os
import subprocess
import sys
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "kernel_trace.py")


def load():
    spec = importlib.util.spec_from_file_location("kernel_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          timeout=60)


def kernel(name, ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream}}


class KernelTrace(unittest.TestCase):
    def test_help_and_bad_command_lines(self):
        r = run(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--variants", r.stdout)
        for bad in (["--windows", "0"], ["--variants", "noequals"],
                    ["--", "--windows", "3"], ["--warmup", "0"]):
            self.assertEqual(run(bad).returncode, 2, bad)

    def test_figures_per_window(self):
        kt = load()
        # Two windows: stream 7 busy [0, 100) and [300, 400) us; stream 9 [50, 150)
        # (half under stream 7's first kernel); one CPU event that is not a kernel.
        trace = {"traceEvents": [
            kernel("gemm", 0, 100, 7), kernel("gemm", 300, 100, 7), kernel("step", 50, 100, 9),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000}]}
        s = kt.summarize(trace, windows=2)
        self.assertAlmostEqual(s["span_ms"], 0.2)    # 400 us over 2 windows
        self.assertAlmostEqual(s["busy_ms"], 0.125)  # [0, 150) and [300, 400): 250 us
        self.assertAlmostEqual(s["idle_ms"], 0.075)
        self.assertAlmostEqual(s["overlap_ms"], 0.025)  # [50, 100) on both streams
        self.assertEqual(s["kernels_per_window"], 1.5)
        self.assertAlmostEqual(s["streams_ms"]["7"], 0.1)
        self.assertAlmostEqual(s["streams_ms"]["9"], 0.05)
        self.assertAlmostEqual(s["kernels_ms"]["gemm"], 0.1)
        self.assertEqual(s["kernel_counts"]["step"], 0.5)
        # The one idle gap, [150, 300) us: after step's end, before the second gemm.
        self.assertEqual(s["gap_counts"]["100us-1ms"], 0.5)
        self.assertAlmostEqual(s["gap_ms"]["100us-1ms"], 0.075)
        self.assertEqual(sum(s["gap_counts"].values()), 0.5)
        self.assertEqual(s["largest_gaps"], [{"us": 150.0, "after": "step", "before": "gemm"}])
        self.assertEqual(s["runtime_ms"], {})
        with_api = dict(trace, traceEvents=trace["traceEvents"] + [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 0,
             "dur": 40}])
        self.assertAlmostEqual(kt.summarize(with_api, windows=2)["runtime_ms"]
                               ["cudaStreamSynchronize"], 0.02)
        table = kt.table(["a", "b"], [s, s], top=5)
        self.assertIn("| gaps 100us-1ms: count, ms | 0.5, 0.075 | 0.5, 0.075 |", table)
        self.assertIn("| span_ms | 0.200 | 0.200 |", table)
        self.assertIn("`gemm`", table)
        with self.assertRaises(ValueError):
            kt.summarize({"traceEvents": []}, windows=1)

    def test_the_close_exposed(self):
        kt = load()
        # In place: the step and the norm after the forward's GEMM, all exposed.
        step = "void accrue::kernels::cuda::fused_optimizer_kernel<float>()"
        norm = "void accrue::kernels::cuda::grad_norm_partials_kernel<float>()"
        in_place = {"traceEvents": [kernel(norm, 0, 30, 7), kernel(step, 30, 100, 7),
                                    kernel("nvjet_gemm", 130, 160, 7)]}
        s = kt.summarize(in_place, windows=1)
        self.assertAlmostEqual(s["close_exposed_ms"], 0.13)
        self.assertAlmostEqual(s["categories_ms"]["close"], 0.13)
        # Under the forward: the step on stream 9 from 30 to 130 us beside a GEMM
        # from 70 us; exposed are the norm and the step's first 40 us. A memset
        # beside the step covers it as any other work does.
        under = {"traceEvents": [kernel(norm, 0, 30, 7), kernel(step, 30, 100, 9),
                                 kernel("nvjet_gemm", 70, 160, 7),
                                 {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 30,
                                  "dur": 10, "args": {"stream": 7}}]}
        s = kt.summarize(under, windows=2)
        self.assertAlmostEqual(s["close_exposed_ms"], 0.030)  # 60 us over 2 windows
        self.assertAlmostEqual(s["overlap_ms"], 0.035)  # the step beside the memset and the GEMM
        self.assertIn("| close_exposed_ms | 0.030 |", kt.table(["under"], [s], top=3))

    def test_memsets_copies_and_the_gaps_around_them(self):
        kt = load()
        # One window: a memset [100, 110) us between two kernels, a copy [300, 320).
        # The gaps: [0+50, 100) after gemm (50 us), [110, 114) after the memset (4 us),
        # [150, 300) before the copy (150 us, not 2-100), [320, 323) after it (3 us).
        trace = {"traceEvents": [
            kernel("gemm", 0, 50, 7),
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 100, "dur": 10,
             "args": {"stream": 7}},
            kernel("flash_fprop", 114, 36, 7),
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 300, "dur": 20,
             "args": {"stream": 7}},
            kernel("gemm", 323, 27, 7)]}
        s = kt.summarize(trace, windows=1)
        self.assertAlmostEqual(s["span_ms"], 0.35)
        self.assertAlmostEqual(s["busy_ms"], 0.143)  # 50 + 10 + 36 + 20 + 27 us
        self.assertEqual(s["kernels_per_window"], 3)
        self.assertEqual(s["copies"]["gpu_memset"], {"count": 1, "ms": 0.01})
        self.assertEqual(s["copies"]["gpu_memcpy"], {"count": 1, "ms": 0.02})
        pairs = [(g["after"], g["before"], g["count"]) for g in s["gap_pairs"]]
        self.assertEqual(pairs, [("gemm", "Memset (Device)", 1),
                                 ("Memset (Device)", "flash_fprop", 1),
                                 ("Memcpy DtoD", "gemm", 1)])
        self.assertAlmostEqual(s["gap_pairs"][1]["us_each"], 4.0)
        self.assertAlmostEqual(s["gap_pairs"][1]["ms"], 0.004)
        table = kt.table(["a"], [s], top=2)
        self.assertIn("| gpu_memset: count, ms | 1.0, 0.010 |", table)

    def test_kernel_time_by_category(self):
        kt = load()
        # Names as CUPTI gives them (demangled); cuDNN's attention says sm90 too.
        names = {
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
            "void cudnn::fusion::matmul_dq<true, 64>(void const*, void const*, void*)": "attention",
            "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)": "attention",
            "void accrue::kernels::cuda::(anonymous namespace)::residual_layer_norm_kernel"
            "<__nv_bfloat16, 4>(...)": "norm",
            "void accrue::kernels::cuda::sum_columns_cluster_kernel<float>(...)": "column sums",
            "void accrue::kernels::cuda::fused_optimizer_kernel<1>(...)": "close",
            "void accrue::kernels::cuda::grad_norm_partials_kernel<float>(...)": "close",
            "void accrue::kernels::cuda::cast_transpose_packed_kernel<__nv_fp8_e4m3>(...)":
                "fp8 casts",
            "void accrue::kernels::cuda::classifier_rows_kernel(...)": "classifier",
            "void accrue::kernels::cuda::embedding_backward_kernel(...)": "embedding",
            "void accrue::kernels::cuda::bias_gelu_kernel<__nv_bfloat16>(...)": "elementwise",
            "void something_new(...)": "other",
        }
        for name, want in names.items():
            self.assertEqual(kt.category(name), want, name)
        trace = {"traceEvents": [
            kernel("nvjet_sm90_tst_a", 0, 100, 7), kernel("sm90_xmma_gemm_b", 100, 50, 7),
            kernel("cudnn_generated_fort_native_sdpa_sm90_flash", 150, 30, 7),
            kernel("void accrue::layer_norm_kernel<float>", 150, 20, 9)]}
        s = kt.summarize(trace, windows=1)
        self.assertAlmostEqual(s["categories_ms"]["gemm"], 0.15)
        self.assertAlmostEqual(s["categories_ms"]["attention"], 0.03)
        self.assertAlmostEqual(s["categories_ms"]["norm"], 0.02)
        self.assertEqual(set(s["categories_ms"]), {"gemm", "attention", "norm"})
        table = kt.table(["a"], [s], top=2)
        self.assertIn("| kernels: gemm | 0.150 |", table)
        self.assertIn("| kernels: norm | 0.020 |", table)
        self.assertNotIn("kernels: close", table)

    def test_waits_for_the_device_only_where_tracing_begins_and_ends(self):
        kt = load()
        waits = [n for n in range(1, 12) if kt.synchronizes_after(n, warmup=4, windows=3)]
        self.assertEqual(waits, [4, 7])

    def test_without_torch_it_says_so(self):
        try:
            import torch  # noqa: F401
            self.skipTest("torch imports here: the refusal is not reached")
        except ImportError:
            pass
        r = run(["--", "--micro-batch", "1"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("torch does not import", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])

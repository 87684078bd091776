"""bench/gpt2_paired.py (the PyTorch recipe and accrue.torch's window interleaved window by
window in one process): --help, its refusals, and where torch imports, a tiny GPT-2 on the
CPU whose two copies train to the same loss."""

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpt2_paired.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=240)


def test_help_and_refusals():
    r = run("--help")
    assert r.returncode == 0 and "--pairs" in r.stdout
    r = run("--pairs", "0")
    assert r.returncode != 0 and "--pairs 0 must be >= 1" in r.stderr
    r = run("--cuda-graphs")
    assert r.returncode != 0 and "--cuda-graphs is not an option here" in r.stderr


def test_pairs_on_the_cpu_train_alike():
    pytest.importorskip("torch")
    r = run("--cpu", "--model", "tiny", "--micro-batch", "2", "--k", "3", "--seq-len", "32",
            "--warmup", "1", "--pairs", "3")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["pairs"] == 3 and row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
    torch_side, bridge = row["torch"], row["accrue_bridge"]
    assert torch_side["window_ms"] > 0 and bridge["tokens_per_s"] > 0
    # One seed, the same tokens, the same number of windows (fp32 on the CPU): one loss up to
    # the two closes' rounding.
    assert bridge["loss"] == pytest.approx(torch_side["loss"], rel=1e-4)

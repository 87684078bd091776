"""python/examples/ run as written: train_gpt2.py on the CPU with a tiny GPT-2,
from random tokens and from token shards, with and without GraphedWindow."""

import importlib.util
import json
import pathlib

import numpy as np

import accrue

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(capsys, *args, printed=3):
    load("train_gpt2").main(["--model", "tiny", "--device", "cpu", "--micro-batch", "2",
                             "--seq-len", "16", "--accum", "2", "--windows", "3",
                             "--warmup", "1", *args])
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("window ") for line in lines) == printed
    return json.loads(lines[-1])


def test_train_gpt2_reads_the_report_every_n_windows(capsys):
    every = run(capsys, "--windows", "6", "--log-every", "3", printed=3)  # windows 1, 4 and 6
    assert every["tokens_per_s_median"] > 0
    assert every["final_loss"] == run(capsys, "--windows", "6", printed=6)["final_loss"]


def test_train_gpt2_runs_and_graphed_windows_train_the_same(capsys):
    plain = run(capsys)
    assert plain["impl"] == "accrue-python" and plain["tokens_per_s_median"] > 0
    assert np.isfinite(plain["final_loss"])
    # GraphedWindow runs eagerly on the CPU: the same random tokens, the same loss.
    assert run(capsys, "--cuda-graphs")["final_loss"] == plain["final_loss"]


def test_train_gpt2_reads_token_shards(capsys, tmp_path):
    rng = np.random.default_rng(0)
    accrue.data.write_shard(str(tmp_path / "tok_0.bin"), rng.integers(0, 512, 400).tolist())
    out = run(capsys, "--shards", str(tmp_path / "tok_*.bin"))
    assert np.isfinite(out["final_loss"])

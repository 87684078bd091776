"""python/examples/ run as written: train_gpt2.py on the CPU with a tiny GPT-2,
from random tokens and from token shards, with and without GraphedWindow;
torch_bridge.py (where torch imports) beside the PyTorch recipe."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

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


def test_train_gpt2_close_under_forward_trains_the_same(capsys):
    # Note [Close under the forward]: on the CPU every range steps at the close.
    plain = run(capsys)
    under = run(capsys, "--close-under-forward")
    assert under["close_under_forward"] and not plain["close_under_forward"]
    assert under["final_loss"] == plain["final_loss"]
    capped = run(capsys, "--close-under-forward", "--close-max-blocks", "4")
    assert capped["close_max_blocks"] == 4 and capped["final_loss"] == plain["final_loss"]
    for bad in (["--close-max-blocks", "4"], ["--close-under-forward", "--close-max-blocks", "-1"]):
        with pytest.raises(SystemExit):
            run(capsys, *bad)


def test_train_gpt2_in_fp8_each_recipe_and_format(capsys):
    plain = run(capsys)
    finals = {}
    for extra in ([], ["--fp8-grad-dtype", "e4m3"], ["--fp8-scaling", "delayed"],
                  ["--fp8-recipe", "block"]):
        out = run(capsys, "--fp8", *extra)
        assert out["fp8"] and np.isfinite(out["final_loss"]), out
        finals[" ".join(extra)] = out["final_loss"]
    # FP8 rounds: another loss than f32's, close to it; each choice rounds its own way.
    assert all(abs(v - plain["final_loss"]) < 0.05 * plain["final_loss"] for v in finals.values())
    assert finals[""] != plain["final_loss"] and finals["--fp8-grad-dtype e4m3"] != finals[""]
    with pytest.raises(SystemExit):
        run(capsys, "--fp8-grad-dtype", "e4m3")  # without --fp8


def test_train_gpt2_reads_token_shards(capsys, tmp_path):
    rng = np.random.default_rng(0)
    accrue.data.write_shard(str(tmp_path / "tok_0.bin"), rng.integers(0, 512, 400).tolist())
    out = run(capsys, "--shards", str(tmp_path / "tok_*.bin"))
    assert np.isfinite(out["final_loss"])


def test_torch_bridge_trains_as_pytorch_on_equal_lengths(capsys):
    pytest.importorskip("torch")
    load("torch_bridge").main(["--device", "cpu", "--windows", "6", "--equal-lengths"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("window ") for line in lines) == 6
    out = json.loads(lines[-1])
    # The same update (the mean of equal means is the big batch's mean), up to f32 rounding
    # that AdamW's normalized steps carry to about lr x rounding.
    assert out["max_parameter_difference"] < 1e-3
    assert abs(out["accrue_first_loss"] - out["torch_first_loss"]) < 1e-5
    assert out["accrue_last_loss"] < out["accrue_first_loss"]
    # With padding the bridge normalizes by the window's tokens: another update, still training.
    load("torch_bridge").main(["--device", "cpu", "--windows", "6"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["accrue_last_loss"] < out["accrue_first_loss"]

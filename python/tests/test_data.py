"""Token shards and the data loader from Python (accrue.data; Note [Token shard
format], Note [Loader positions] in data/token_shards.h). numpy only."""

import numpy as np
import pytest

import accrue


def shards(tmp_path, lengths, seed=0, high=1000):
    rng = np.random.default_rng(seed)
    tokens = []
    for i, n in enumerate(lengths):
        t = rng.integers(0, high, n)
        accrue.data.write_shard(str(tmp_path / f"train_{i:02d}.bin"), t.tolist())
        tokens.append(t)
    return tokens


def test_batches_are_the_shards_tokens_rank_by_rank(tmp_path):
    tokens = shards(tmp_path, [200, 150])
    s = accrue.data.TokenShards(str(tmp_path / "train_*.bin"))
    assert len(s) == 2 and s.tokens == [200, 150] and s.total_tokens == 350
    assert [p.split("/")[-1] for p in s.paths] == ["train_00.bin", "train_01.bin"]
    b, t, world = 2, 8, 2
    loaders = [accrue.data.DataLoader(s, b, t, rank=r, world_size=world, vocab_size=1000)
               for r in range(world)]
    assert loaders[0].step_tokens == world * b * t
    # Every rank reads its B*T + 1 tokens of the step; the step moves on by world*B*T.
    for step in range(3):
        offset = step * world * b * t
        for r, loader in enumerate(loaders):
            assert loader.position == (0, offset, 0)
            x, y = loader.next_batch()
            assert tuple(x.shape) == (b, t) and x.dtype == accrue.i32
            want = tokens[0][offset + r * b * t: offset + (r + 1) * b * t + 1]
            np.testing.assert_array_equal(x.numpy().reshape(-1), want[:-1])
            np.testing.assert_array_equal(y.numpy().reshape(-1), want[1:])


def test_a_saved_position_replays_the_same_batches(tmp_path):
    shards(tmp_path, [100, 90, 80])
    s = accrue.data.TokenShards([str(tmp_path / f"train_{i:02d}.bin") for i in (2, 0, 1)])
    loader = accrue.data.DataLoader(s, 2, 10)
    for _ in range(5):  # past the end of the first shard
        loader.next_batch()
    saved = loader.position
    assert saved[0] >= 1
    ahead = [loader.next_batch()[0].numpy() for _ in range(6)]
    loader.set_position(saved)
    again = [loader.next_batch()[0].numpy() for _ in range(6)]
    for a, b in zip(ahead, again):
        np.testing.assert_array_equal(a, b)
    loader.reset()
    assert loader.position == (0, 0, 0)


def test_large_vocabularies_write_the_uint32_version(tmp_path):
    # Tokens past 65535 need the uint32 version (the Llama trainer's documents
    # read it); TokenShards and the DataLoader read uint16 shards and say so.
    path = tmp_path / "big.bin"
    accrue.data.write_shard(str(path), [70000, 1, 2, 3] * 10)
    assert path.stat().st_size == 1024 + 4 * 40
    with pytest.raises(accrue.Error, match="big.bin.*version.*found 2"):
        accrue.data.TokenShards(str(path))


def test_bad_files_and_options_are_refused_by_name(tmp_path):
    shards(tmp_path, [50], high=600)
    with pytest.raises(accrue.Error, match="no_such_\\*"):
        accrue.data.TokenShards(str(tmp_path / "no_such_*.bin"))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 100)
    with pytest.raises(accrue.Error, match="bad.bin"):
        accrue.data.TokenShards(str(bad))
    s = accrue.data.TokenShards(str(tmp_path / "train_*.bin"))
    with pytest.raises(accrue.Error, match="train_00.bin"):
        accrue.data.DataLoader(s, 1, 8, vocab_size=100)  # tokens up to 599
    with pytest.raises(accrue.Error):
        accrue.data.DataLoader(s, 4, 64)  # a step needs more tokens than the shard has
    with pytest.raises(accrue.Error, match="position 1"):
        accrue.data.write_shard(str(tmp_path / "neg.bin"), [1, -2])

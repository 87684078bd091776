#!/usr/bin/env python3
"""Writes llm.c-format token shards from text files, with byte-level tokens.

Every byte of the input files is one token (its value, 0..255), so the shards
suit a model with a vocabulary of 256 (accrue_train_gpt2 --model tiny). The
files are concatenated in the order given; the first --val-fraction of the
tokens becomes the validation split, the rest the training split, each cut
into shards of at most --shard-tokens tokens:

    PREFIX_val_000000.bin, PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...

The shard format (Note [Token shard format] in data/token_shards.h): 256
little-endian int32 (magic 20240520, version 1, token count n, zeros), then n
little-endian uint16 tokens. Pure Python 3 standard library.

Example:
    python3 tools/make_shards.py README.md docs/ARCHITECTURE.md --output-prefix /tmp/readme
    accrue_train_gpt2 --model tiny --train-data '/tmp/readme_train_*.bin' \\
                      --val-data '/tmp/readme_val_*.bin'
"""

import argparse
import os
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32


def write_shard(path, tokens):
    """Writes one shard; `tokens` is a bytes-like object of byte tokens."""
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    # Little-endian uint16 of a byte token: the byte, then a zero byte.
    data = bytearray(2 * len(tokens))
    data[0::2] = tokens
    with open(path, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        f.write(data)


def write_split(prefix, split, tokens, shard_tokens):
    """Cuts `tokens` into shards PREFIX_SPLIT_NNNNNN.bin; returns the paths written."""
    paths = []
    for start in range(0, len(tokens), shard_tokens):
        path = "%s_%s_%06d.bin" % (prefix, split, len(paths))
        chunk = tokens[start : start + shard_tokens]
        write_shard(path, chunk)
        print("wrote %s: %d tokens (%d bytes)" % (path, len(chunk), 4 * HEADER_INTS + 2 * len(chunk)))
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Write llm.c-format token shards (byte-level tokens 0..255) from text files.",
        epilog="Example: python3 tools/make_shards.py README.md --output-prefix /tmp/readme",
    )
    parser.add_argument("inputs", nargs="+", help="text files (any bytes), concatenated in order")
    parser.add_argument(
        "--output-prefix",
        required=True,
        help="shards are written as PREFIX_val_NNNNNN.bin and PREFIX_train_NNNNNN.bin",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="fraction of the tokens (taken from the start) for validation, in [0, 1); default 0.1",
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        default=100_000_000,
        help="at most this many tokens per shard; default 100000000",
    )
    args = parser.parse_args(argv)

    if not 0.0 <= args.val_fraction < 1.0:
        parser.error("--val-fraction must be in [0, 1), got %g" % args.val_fraction)
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        parser.error("--shard-tokens must be in [1, %d], got %d" % (MAX_SHARD_TOKENS, args.shard_tokens))

    tokens = bytearray()
    for path in args.inputs:
        try:
            with open(path, "rb") as f:
                tokens += f.read()
        except OSError as e:
            parser.error("cannot read %s: %s" % (path, e.strerror))
    if not tokens:
        parser.error("the input files are empty: no tokens to write")

    out_dir = os.path.dirname(args.output_prefix)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    n_val = int(len(tokens) * args.val_fraction)
    print("%d tokens from %d file(s): %d validation, %d training"
          % (len(tokens), len(args.inputs), n_val, len(tokens) - n_val))
    write_split(args.output_prefix, "val", tokens[:n_val], args.shard_tokens)
    write_split(args.output_prefix, "train", tokens[n_val:], args.shard_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())

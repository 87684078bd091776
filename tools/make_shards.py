#!/usr/bin/env python3
"""Writes llm.c-format token shards from text files.

By default every byte of the input files is one token (its value, 0..255), so
the shards suit a model with a vocabulary of 256 (accrue_train_gpt2 --model
tiny). The files are concatenated in the order given; the first
--val-fraction of the tokens becomes the validation split, the rest the
training split, each cut into shards of at most --shard-tokens tokens:

    PREFIX_val_000000.bin, PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...

Documents (for data::DocumentBatches, Note [Document batches] in
data/document_batches.h): with --tokenizer NAME_OR_DIR the text is encoded
by a Hugging Face tokenizer (transformers' AutoTokenizer; transformers must
be installed) and its EOS token is appended after every document (and, with
--bos, its BOS token put before it); with byte tokens, --eos-id N (N >= 256)
appends N. A document is one input file, or one line that is not blank with
--documents lines (the line end dropped). The validation split then ends at a
document boundary.

The shard format (Note [Token shard format] in data/token_shards.h): 256
little-endian int32 (magic 20240520, version, token count n, zeros), then n
little-endian tokens: uint16 with version 1, uint32 with version 2 (Note
[Token shard versions] in data/document_batches.h), written when the
vocabulary is over 65536. The byte path needs only the Python 3 standard
library.

Example:
    python3 tools/make_shards.py README.md docs/ARCHITECTURE.md --output-prefix /tmp/readme
    accrue_train_gpt2 --model tiny --train-data '/tmp/readme_train_*.bin' \\
                      --val-data '/tmp/readme_val_*.bin'
"""

import argparse
import array
import os
import struct
import sys

MAGIC = 20240520
VERSION_U16 = 1
VERSION_U32 = 2
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32


def write_shard(path, tokens, version):
    """Writes one shard of integer tokens (uint16 for version 1, uint32 for 2)."""
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, version, len(tokens)
    if isinstance(tokens, (bytes, bytearray)):
        # Little-endian uint16 of a byte token: the byte, then a zero byte.
        data = bytearray(2 * len(tokens))
        data[0::2] = tokens
    else:
        words = array.array("H" if version == VERSION_U16 else "I", tokens)
        assert words.itemsize == (2 if version == VERSION_U16 else 4)
        if sys.byteorder != "little":
            words.byteswap()
        data = words.tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        f.write(data)


def write_split(prefix, split, tokens, shard_tokens, version):
    """Cuts `tokens` into shards PREFIX_SPLIT_NNNNNN.bin; returns the paths written."""
    width = 2 if version == VERSION_U16 else 4
    paths = []
    for start in range(0, len(tokens), shard_tokens):
        path = "%s_%s_%06d.bin" % (prefix, split, len(paths))
        chunk = tokens[start : start + shard_tokens]
        write_shard(path, chunk, version)
        print("wrote %s: %d tokens (%d bytes)" % (path, len(chunk), 4 * HEADER_INTS + width * len(chunk)))
        paths.append(path)
    return paths


def read_documents(parser, paths, per_line):
    """The documents as bytes: one per file, or one per line (line ends dropped)."""
    docs = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            parser.error("cannot read %s: %s" % (path, e.strerror))
        if per_line:
            docs.extend(line for line in data.splitlines() if line.strip())
        elif data:
            docs.append(data)
    return docs


def load_tokenizer(parser, name):
    """transformers' AutoTokenizer for NAME_OR_DIR, with its EOS id and vocabulary size."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        parser.error("--tokenizer needs the transformers package (pip install transformers); "
                     "without it, use byte tokens (--eos-id 256 for documents)")
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 (transformers raises many kinds)
        parser.error("cannot load the tokenizer %r: %s" % (name, e))
    if tok.eos_token_id is None:
        parser.error("the tokenizer %r has no EOS token: documents need one" % name)
    return tok, tok.eos_token_id, len(tok)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Write llm.c-format token shards from text files: byte tokens 0..255, "
        "or a Hugging Face tokenizer's with an EOS after every document.",
        epilog="Example: python3 tools/make_shards.py README.md --output-prefix /tmp/readme",
    )
    parser.add_argument("inputs", nargs="*", help="text files (any bytes), concatenated in order")
    parser.add_argument(
        "--inputs-from",
        metavar="LIST",
        help="read more input file names from LIST, one per line, after the ones given "
        "(thousands of files overflow a command line)",
    )
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
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        help="encode with this Hugging Face tokenizer (needs transformers) and append its EOS "
        "after every document",
    )
    parser.add_argument(
        "--eos-id",
        type=int,
        help="byte tokens: append this token (>= 256) after every document; the vocabulary is then eos-id + 1",
    )
    parser.add_argument(
        "--bos",
        action="store_true",
        help="with --tokenizer: also put the tokenizer's BOS token before every document "
        "(as Llama tokenizers do when adding special tokens)",
    )
    parser.add_argument(
        "--documents",
        choices=["files", "lines"],
        default="files",
        help="what one document is: an input file (default) or a line that is not blank",
    )
    args = parser.parse_args(argv)
    if args.inputs_from is not None:
        try:
            with open(args.inputs_from, encoding="utf-8") as f:
                args.inputs += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            parser.error("cannot read --inputs-from %s: %s" % (args.inputs_from, e.strerror))
    if not args.inputs:
        parser.error("no input files (give them, or --inputs-from LIST)")

    if not 0.0 <= args.val_fraction < 1.0:
        parser.error("--val-fraction must be in [0, 1), got %g" % args.val_fraction)
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        parser.error("--shard-tokens must be in [1, %d], got %d" % (MAX_SHARD_TOKENS, args.shard_tokens))

    if args.tokenizer is not None and args.eos_id is not None:
        parser.error("--eos-id is for byte tokens; a --tokenizer brings its own EOS")
    if args.eos_id is not None and not 256 <= args.eos_id < 2**32:
        parser.error("--eos-id must be in [256, 2^32) (bytes are 0..255), got %d" % args.eos_id)
    with_documents = args.tokenizer is not None or args.eos_id is not None
    if args.bos and args.tokenizer is None:
        parser.error("--bos needs --tokenizer (the BOS is the tokenizer's)")
    if args.documents == "lines" and not with_documents:
        parser.error("--documents lines needs an EOS: pass --tokenizer or --eos-id")

    if not with_documents:
        tokens = bytearray()
        for path in args.inputs:
            try:
                with open(path, "rb") as f:
                    tokens += f.read()
            except OSError as e:
                parser.error("cannot read %s: %s" % (path, e.strerror))
        vocab, eos, doc_ends = 256, None, None
    else:
        docs = read_documents(parser, args.inputs, args.documents == "lines")
        if args.tokenizer is not None:
            tok, eos, vocab = load_tokenizer(parser, args.tokenizer)
            bos = []
            if args.bos:
                if tok.bos_token_id is None:
                    parser.error("the tokenizer %r has no BOS token (--bos)" % args.tokenizer)
                bos = [tok.bos_token_id]
            # Special tokens are placed here, not by the tokenizer: exactly one EOS per document.
            encode = lambda d: bos + tok.encode(d.decode("utf-8", errors="replace"), add_special_tokens=False)
        else:
            eos, vocab = args.eos_id, args.eos_id + 1
            encode = list
        tokens, doc_ends = [], []
        for d in docs:
            tokens.extend(encode(d))
            tokens.append(eos)
            doc_ends.append(len(tokens))
        if tokens and max(tokens) >= vocab:
            parser.error("token %d is not below the vocabulary size %d" % (max(tokens), vocab))
    if not tokens:
        parser.error("the input files are empty: no tokens to write")
    version = VERSION_U16 if vocab <= 65536 else VERSION_U32
    out_dir = os.path.dirname(args.output_prefix)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    n_val = int(len(tokens) * args.val_fraction)
    if doc_ends is not None and n_val > 0:
        # The validation split ends with a whole document.
        n_val = next(e for e in doc_ends if e >= n_val)
        if n_val == len(tokens):
            parser.error("--val-fraction %g leaves no whole document for training" % args.val_fraction)
    print("%d tokens from %d file(s): %d validation, %d training; vocabulary %d%s, shard version %d"
          % (len(tokens), len(args.inputs), n_val, len(tokens) - n_val, vocab,
             "" if eos is None else ", EOS %d after each of %d documents" % (eos, len(doc_ends)), version))
    write_split(args.output_prefix, "val", tokens[:n_val], args.shard_tokens, version)
    write_split(args.output_prefix, "train", tokens[n_val:], args.shard_tokens, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tools/make_shards.py: the byte path writes the same bytes as before, the
document path appends an EOS after every document (file or line) and ends the
validation split at a document, and --tokenizer encodes with a Hugging Face
tokenizer (a tiny one built here with the tokenizers library), writing uint32
(version 2) shards for a vocabulary over 65536. The tokenizer tests skip when
transformers or tokenizers cannot be imported; without transformers the
option must fail with a clear message.

    python3 tests/data/make_shards_test.py [path/to/tools/make_shards.py]
"""

import importlib.util
import os
import struct
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "make_shards.py")


def have(module):
    return importlib.util.find_spec(module) is not None


def read_shard(path):
    """(version, tokens), checking the header against the file size independently of the script."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520, magic
    assert data[12:1024] == bytes(1012), "unused header ints must be zero"
    width = {1: 2, 2: 4}[version]
    assert len(data) == 1024 + width * n, (len(data), n, width)
    return version, list(struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), data[1024:]))


class MakeShardsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.texts = [b"first file\nline two\n", b"\xc3\xa9t\xc3\xa9\nlast line\n\n", b"third"]
        self.files = []
        for i, t in enumerate(self.texts):
            p = os.path.join(self.dir, "in%d.txt" % i)
            with open(p, "wb") as f:
                f.write(t)
            self.files.append(p)

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args, ok=True):
        r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        if ok:
            self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def prefix(self, name):
        return os.path.join(self.dir, name)

    def test_byte_tokens_unchanged(self):
        self.run_script(*self.files, "--output-prefix", self.prefix("b"), "--val-fraction", "0.25")
        allb = b"".join(self.texts)
        n_val = int(len(allb) * 0.25)
        self.assertEqual(read_shard(self.prefix("b_val_000000.bin")), (1, list(allb[:n_val])))
        self.assertEqual(read_shard(self.prefix("b_train_000000.bin")), (1, list(allb[n_val:])))

    def test_documents_end_with_eos(self):
        self.run_script(*self.files, "--output-prefix", self.prefix("f"), "--eos-id", "256",
                        "--val-fraction", "0")
        want = []
        for t in self.texts:
            want += list(t) + [256]
        self.assertEqual(read_shard(self.prefix("f_train_000000.bin")), (1, want))
        # Lines: non-empty lines are documents; the validation split ends at one.
        self.run_script(*self.files, "--output-prefix", self.prefix("l"), "--eos-id", "70000",
                        "--documents", "lines", "--val-fraction", "0.3", "--shard-tokens", "10")
        lines = [l for t in self.texts for l in t.splitlines() if l.strip()]
        stream = []
        for l in lines:
            stream += list(l) + [70000]
        val, train = [], []
        for name in sorted(os.listdir(self.dir)):
            if name.startswith("l_"):
                version, toks = read_shard(os.path.join(self.dir, name))
                self.assertEqual(version, 2)  # vocabulary 70001 > 65536
                self.assertLessEqual(len(toks), 10)
                (val if "_val_" in name else train).extend(toks)
        self.assertEqual(val + train, stream)
        self.assertEqual(val[-1], 70000)
        self.assertGreaterEqual(len(val), int(len(stream) * 0.3))

    def test_inputs_from_a_list_file(self):
        # The first file on the command line, the other two from the list: the same order.
        listing = os.path.join(self.dir, "list.txt")
        with open(listing, "w", encoding="utf-8") as f:
            f.write(self.files[1] + "\n\n" + self.files[2] + "\n")
        self.run_script(self.files[0], "--inputs-from", listing, "--output-prefix",
                        self.prefix("a"), "--val-fraction", "0")
        self.assertEqual(read_shard(self.prefix("a_train_000000.bin")), (1, list(b"".join(self.texts))))
        r = self.run_script("--output-prefix", self.prefix("x"), ok=False)
        self.assertIn("no input files", r.stderr)
        r = self.run_script("--inputs-from", os.path.join(self.dir, "none.txt"), "--output-prefix",
                            self.prefix("x"), ok=False)
        self.assertIn("cannot read --inputs-from", r.stderr)

    def test_bad_options_refused(self):
        r = self.run_script(*self.files, "--output-prefix", self.prefix("x"), "--eos-id", "12", ok=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--eos-id must be in [256", r.stderr)
        r = self.run_script(*self.files, "--output-prefix", self.prefix("x"), "--documents", "lines", ok=False)
        self.assertIn("--documents lines needs an EOS", r.stderr)
        r = self.run_script(*self.files, "--output-prefix", self.prefix("x"), "--eos-id", "300", "--bos", ok=False)
        self.assertIn("--bos needs --tokenizer", r.stderr)

    def test_tokenizer_missing_transformers_is_a_clear_error(self):
        if have("transformers"):
            self.skipTest("transformers is installed here")
        r = self.run_script(*self.files, "--output-prefix", self.prefix("t"), "--tokenizer", "gpt2", ok=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--tokenizer needs the transformers package", r.stderr)

    def make_tokenizer(self, extra_vocab):
        """A word-level tokenizer with an EOS, saved as transformers loads it."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = sorted({w for t in self.texts for w in t.decode("utf-8").split()})
        vocab = {"<unk>": 0, "</s>": 1, "<s>": 2}
        for w in words + ["filler%d" % i for i in range(extra_vocab)]:
            vocab[w] = len(vocab)
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>")
        path = os.path.join(self.dir, "tok%d" % extra_vocab)
        fast.save_pretrained(path)
        return path, fast

    def test_tokenizer_documents(self):
        if not (have("transformers") and have("tokenizers")):
            self.skipTest("transformers or tokenizers is not importable: --tokenizer not tested")
        for extra, version in [(10, 1), (70000, 2)]:
            path, fast = self.make_tokenizer(extra)
            p = self.prefix("t%d" % extra)
            self.run_script(*self.files, "--output-prefix", p, "--tokenizer", path, "--val-fraction", "0")
            want = []
            for t in self.texts:
                want += fast.encode(t.decode("utf-8"), add_special_tokens=False) + [fast.eos_token_id]
            self.assertEqual(read_shard(p + "_train_000000.bin"), (version, want))
            self.assertEqual(want.count(1), 3)
        # --bos and --documents lines: BOS, the line's tokens, EOS for every line that is not blank.
        self.run_script(*self.files, "--output-prefix", p + "l", "--tokenizer", path, "--bos",
                        "--documents", "lines", "--val-fraction", "0")
        want = []
        for t in self.texts:
            for line in t.decode("utf-8").splitlines():
                if line.strip():
                    want += [2] + fast.encode(line, add_special_tokens=False) + [1]
        self.assertEqual(read_shard(p + "l_train_000000.bin"), (2, want))
        self.assertEqual(want.count(2), 5)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
        SCRIPT = sys.argv.pop(1)
    unittest.main(verbosity=2)

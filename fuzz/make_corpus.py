#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/ (small: valid files of every
supported kind plus a few edge cases the parsers must reject). Standard
library only; deterministic, so rerunning it changes nothing.

    python3 fuzz/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors: u64 header length, JSON header, data ------------------------
ST_SIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "BOOL": 1}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)] laid out in order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def raw(fmt, values):
    return struct.pack("<" + fmt * len(values), *values)


write("safetensors", "two_tensors", safetensors(
    [("w", "F32", [2, 3], raw("f", [1, -2, 3.5, 0.25, 1e-3, 7])),
     ("ids", "I64", [2], raw("q", [-1, 1 << 40]))], {"step": "1000", "note": "héllo"}))
write("safetensors", "every_dtype", safetensors(
    [("a", "F64", [1], raw("d", [3.25])), ("b", "I32", [2], raw("i", [7, -9])),
     ("c", "BF16", [2], raw("H", [0x3f80, 0xc000])), ("d", "F16", [1, 2], raw("H", [0x3c00, 0x7bff])),
     ("e", "BOOL", [3], bytes([0, 1, 1]))]))
write("safetensors", "scalar_and_empty", safetensors(
    [("s", "F32", [], raw("f", [2.5])), ("z", "F32", [0, 4], b"")]))
write("safetensors", "no_tensors", safetensors([], {}))
write("safetensors", "escaped_name", safetensors(
    [("\u00e9\\\"\ud83d\ude00\n", "I32", [1], raw("i", [5]))]))
# Rejected: overlapping tensors, a bad BOOL byte, a header longer than the file.
overlap = safetensors([("a", "I32", [1], raw("i", [1])), ("b", "I32", [1], raw("i", [2]))])
write("safetensors", "bad_overlap", overlap.replace(b"[4,8]", b"[0,4]"))
write("safetensors", "bad_bool", safetensors([("e", "BOOL", [2], bytes([0, 2]))]))
write("safetensors", "bad_header_length", struct.pack("<Q", 1 << 62) + b"{}")


# Checksums as accrue writes them (Note [Tensor checksums] in core/safetensors.cpp):
# CRC32C of each tensor's bytes, and of the canonical form of the rest of the header.
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def checksummed(tensors, metadata):
    """safetensors(tensors, metadata) plus the checksum entries accrue writes."""
    canonical, offset, entries = b"", 0, []
    for k in sorted(metadata, key=lambda k: k.encode()):
        canonical += b"m" + k.encode() + b"\0" + metadata[k].encode() + b"\0"
    for name, dtype, shape, data in tensors:
        entries.append((name.encode(), dtype, shape, offset, offset + len(data)))
        offset += len(data)
    for name, dtype, shape, begin, end in sorted(entries):
        canonical += (b"t" + name + b"\0" + dtype.encode() + b"\0" +
                      ",".join(map(str, shape)).encode() + b"\0" + f"{begin},{end}".encode() + b"\0")
    full = dict(metadata)
    full["accrue.crc32c"] = f"{crc32c(canonical):08x}"
    for name, _, _, data in tensors:
        full["accrue.crc32c." + name] = f"{crc32c(data):08x}"
    return safetensors(tensors, full)


CHECKSUMMED = [("w", "F32", [2, 3], raw("f", [1, -2, 3.5, 0.25, 1e-3, 7])),
               ("flag", "BOOL", [2], bytes([1, 0]))]
write("safetensors", "checksummed", checksummed(CHECKSUMMED, {"step": "7"}))
# Rejected: a flipped bit in a tensor's data; a malformed checksum entry.
flipped = bytearray(checksummed(CHECKSUMMED, {"step": "7"}))
flipped[-3] ^= 0x10
write("safetensors", "bad_checksum", bytes(flipped))
write("safetensors", "bad_checksum_entry", safetensors(
    [("w", "I32", [1], raw("i", [3]))], {"accrue.crc32c.w": "XYZ", "accrue.crc32c": "00000000"}))


# ---- npy: magic, version, header length, dict header, data ---------------------
def npy(descr, shape, payload, fortran=False, version=(1, 0)):
    shape_text = "(" + "".join(f"{s}, " for s in shape).rstrip(" ")
    if len(shape) != 1:
        shape_text = shape_text.rstrip(",")
    shape_text += ")"
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    length_bytes = 2 if version[0] == 1 else 4
    prefix = 6 + 2 + length_bytes
    total = prefix + len(header) + 1
    header = (header + " " * (-total % 64) + "\n").encode("latin1" if version[0] < 3 else "utf8")
    length = struct.pack("<H" if length_bytes == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header + payload


write("npy", "f32_2x3", npy("<f4", [2, 3], raw("f", [1, 2, 3, 4, 5, 6.5])))
write("npy", "f64_v2", npy("<f8", [2], raw("d", [1e300, -0.0]), version=(2, 0)))
write("npy", "i64_v3", npy("<i8", [1, 2], raw("q", [-5, 1 << 50]), version=(3, 0)))
write("npy", "i32_fortran", npy("<i4", [2, 3], raw("i", [1, 4, 2, 5, 3, 6]), fortran=True))
write("npy", "f16_scalar", npy("<f2", [], raw("H", [0x3c00])))
write("npy", "bool_empty", npy("|b1", [0], b""))
write("npy", "bool_1d", npy("|b1", [3], bytes([1, 0, 1])))
# Rejected: big-endian, short data.
write("npy", "bad_big_endian", npy(">f4", [1], b"\x3f\x80\x00\x00"))
write("npy", "bad_short_data", npy("<f8", [4], raw("d", [1, 2])))


# ---- llm.c token shards: 256 int32 header, uint16 tokens -------------------------
def shard(tokens, magic=20240520, version=1, count=None):
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return raw("i", header) + raw("H", tokens)


write("token_shards", "seven_tokens", shard([1, 2, 3, 65535, 0, 50256, 9]))
write("token_shards", "two_tokens", shard([10, 20]))
write("token_shards", "empty", shard([]))
write("token_shards", "bad_magic", shard([1, 2], magic=20240519))
write("token_shards", "bad_count", shard([1, 2, 3], count=-3))

# ---- exchange messages: byte 0 picks the world size, then 24-byte hellos -------
# (the whole input is also read as one 24-byte reply). Little-endian "ACRX", version 1.
MAGIC, VERSION = 0x58524341, 1
FP = 0x0123456789ABCDEF


def hello(rank, world, fp=FP, magic=MAGIC):
    return struct.pack("<IIIIQ", magic, VERSION, rank, world, fp)


def reply(status, world, fp=FP):
    return struct.pack("<IIIIQ", MAGIC, VERSION, status, world, fp)


write("exchange_message", "world4_ok", bytes([3]) + hello(1, 4) + hello(2, 4) + hello(3, 4))
write("exchange_message", "world3_mismatches",
      bytes([2]) + hello(1, 3, fp=7) + hello(1, 3) + hello(9, 3) + hello(2, 5))
write("exchange_message", "bad_magic_and_truncated",
      bytes([1]) + hello(1, 2, magic=0x12345678) + hello(1, 2)[:10])
for status in range(5):
    write("exchange_message", f"reply_status{status}", reply(status, 2))

# ---- Hugging Face config.json and model.safetensors.index.json ------------------
# (fuzz_hf_config reads each input as both.)
LLAMA32 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256}
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643,
    "eos_token_id": [151645, 151643], "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 3072, "layer_types": ["full_attention"] * 3,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
    "vocab_size": 151936, "id2label": {"0": "A\u00e9\\n"}, "nested": [[{"a": [1e-300, -0.0]}]]}
write("hf_config", "llama3.2_1b", json.dumps(LLAMA32, indent=2).encode())
write("hf_config", "qwen3_0.6b", json.dumps(QWEN3, indent=2).encode())
write("hf_config", "llama_minimal", json.dumps(
    {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
     "num_hidden_layers": 1, "num_attention_heads": 2}).encode())
write("hf_config", "unknown_model_type", json.dumps(dict(LLAMA32, model_type="gemma2")).encode())
write("hf_config", "deep", b'{"x": ' + b"[" * 70 + b"]" * 70 + b"}")
write("hf_config", "index", json.dumps(
    {"metadata": {"total_size": 48, "total_parameters": 12},
     "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                    "lm_head.weight": "model-00002-of-00002.safetensors"}},
    indent=2, sort_keys=True).encode())
write("hf_config", "index_escape", json.dumps(
    {"weight_map": {"w": "../model.safetensors"}}).encode())

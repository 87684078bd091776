#!/usr/bin/env python3
"""Writes the seed corpus of the resume targets, fuzz/corpus/run_record/ and
fuzz/corpus/metrics_log/ (fuzz/README.md). Standard library only;
deterministic, so rerunning it changes nothing.

    python3 fuzz/make_resume_corpus.py
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


def safetensors(metadata):
    """One f32 tensor "x" of shape [1] and the metadata (no checksums)."""
    header = {"__metadata__": metadata,
              "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + struct.pack("<f", 1.0)


# ---- run_record: the record of fuzz_run_record.cpp, as written and altered ------
RECORD = {
    "config.n_layer": "2", "config.n_embd": "64", "dtype": "f32", "world_size": "1",
    "micro_batch": "2", "micro_steps": "4", "seed": "11", "dropout": "0.10000000000000001",
    "data": "synthetic", "lr": "0.0030000000000000001", "warmup_windows": "2",
    "windows": "20", "val_every": "0", "metrics": "",
}


def record(**changes):
    meta = {"accrue.run." + k: v for k, v in RECORD.items()}
    meta.update({"accrue.run." + k: v for k, v in changes.items()})
    meta["format"] = "accrue_train_gpt2 checkpoint v3"
    meta["windows_closed"] = "7"
    return meta


# The file's last byte (here the tensor's) chooses the allowed change words:
# bit 0 lr, 1 windows, 2 validation, 3 metrics.
write("run_record", "same_run", safetensors(record()))
write("run_record", "other_k_and_seed", safetensors(record(micro_steps="8", seed="12")))
write("run_record", "schedule_changed", safetensors(record(lr="0.001", windows="40")))
write("run_record", "v2_keys_only", safetensors({
    "format": "accrue_train_gpt2 checkpoint v2", "config.n_layer": "2", "config.n_embd": "64",
    "dtype": "f32", "world_size": "1", "micro_batch": "2", "windows_closed": "3"}))
write("run_record", "v2_other_model", safetensors({"config.n_layer": "3", "dtype": "bf16"}))
write("run_record", "no_metadata", safetensors({}))

# ---- metrics_log: 8 bytes of window count, then the metrics file -----------------


def metrics(windows, text):
    return struct.pack("<q", windows) + text.encode()


def rows(first, last):
    return "".join('{"window": %d, "loss": 5.5}\n' % w for w in range(first, last + 1))


write("metrics_log", "rows_past_checkpoint", metrics(5, rows(1, 8)))
write("metrics_log", "all_kept", metrics(9, rows(1, 8)))
write("metrics_log", "row_cut_short", metrics(9, rows(1, 4) + '{"window": 5, "lo'))
write("metrics_log", "foreign_row", metrics(9, rows(1, 2) + "garbage\n" + rows(3, 4)))
write("metrics_log", "negative_window", metrics(9, '{"window": -1}\n' + rows(1, 2)))
write("metrics_log", "empty", metrics(3, ""))

# ---- window_state: the seeds fuzz_window_state writes, also without checksums -----
# `ACCRUE_FUZZ_WRITE_SEEDS=fuzz/corpus/window_state build/fuzz/fuzz_window_state`
# writes between_windows and micro_step_2_of_4 (with CRC32C entries, as every
# accrue save); their *_plain copies here drop those entries, so that the
# fuzzer's changes to the tensors' bytes reach Window::load_state_dict
# instead of the checksum test.


def without_checksums(data):
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = {k: v for k, v in header.get("__metadata__", {}).items()
            if not k.startswith("accrue.crc32c")}
    if meta:
        header["__metadata__"] = meta
    else:
        header.pop("__metadata__", None)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n :]


for seed in ("between_windows", "micro_step_2_of_4"):
    path = os.path.join(HERE, "corpus", "window_state", seed)
    if os.path.exists(path):
        with open(path, "rb") as f:
            write("window_state", seed + "_plain", without_checksums(f.read()))

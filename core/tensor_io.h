// Tensor files: safetensors (many named tensors plus string metadata) and
// numpy's .npy (one tensor).
//
// Both readers treat the file as untrusted input: every length, offset and
// shape is checked against the file's real size before anything is allocated
// or read, so a malformed file throws accrue::Error naming the file and what is
// wrong, and never crashes, over-reads or allocates more than the file holds.
// Tensors come back contiguous on the CPU; move them with .to(device).
//
//   std::map<std::string, Tensor> weights = accrue::load_safetensors("model.safetensors");
//   Tensor w = weights.at("lm_head.weight").to(Device::cuda());
//   accrue::save_safetensors("ckpt.safetensors", {{"w", w}}, {{"step", "1000"}});
//
// Byte order: both formats are little-endian and so is every host accrue
// builds for (checked at compile time).
#pragma once

#include <map>
#include <string>

#include "accrue/core/tensor.h"

namespace accrue {

// Safetensors (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON, then the data section.
// Supported dtypes: F32, F64, BF16, F16, I32, I64, BOOL; any other dtype throws,
// naming the dtype and the tensor.
//
// load_safetensors enforces the format's rules, stricter than most readers:
// the header is at most 100 MB of UTF-8 JSON (padding: JSON whitespace only);
// every tensor entry has exactly "dtype", "shape" and "data_offsets"; keys are
// unique; each tensor's bytes are numel * element size; and the tensors cover
// the data section exactly, without overlaps, holes or trailing bytes. BOOL
// bytes must be 0 or 1. The optional "__metadata__" (string -> string) is
// returned through `metadata` when it is not null.
//
// Checksums (Note [Tensor checksums] in core/safetensors.cpp): every file
// save_safetensors writes records a CRC32C of each tensor's bytes and one of
// the header; load_safetensors verifies them when the file carries them and
// throws naming the file, the tensor (or the header) and both checksums on a
// mismatch. Files without checksums (PyTorch's, transformers') load as before.
// The checksum entries ("accrue.crc32c" and "accrue.crc32c.<name>") are not
// returned in `metadata`, and save_safetensors refuses them as metadata keys.
std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata);
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Writes tensors of any device, dtype and strides (as contiguous little-endian
// bytes). The layout is the reference implementation's, byte for byte, given
// the same metadata (the caller's plus the checksums): entries ordered by
// element size, largest first, then by name (so every tensor's data is
// naturally aligned), data offsets contiguous, compact JSON padded with spaces
// to a multiple of 8 bytes, "__metadata__" first. Names and metadata must be
// valid UTF-8; "__metadata__" is not a valid tensor name.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// NumPy .npy (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
// Reads versions 1.0, 2.0 and 3.0 with descr '<f4', '<f8', '<f2', '<i4', '<i8'
// or '|b1'. Big-endian ('>') and other dtypes throw. fortran_order True is
// supported: the column-major data is transposed into a C-contiguous tensor.
// The data must fill the rest of the file exactly (short or trailing bytes throw).
Tensor load_npy(const std::string& path);

// Writes C-order version 1.0 (2.0 if the header would not fit), with the same
// header bytes as numpy.save. bf16 has no numpy dtype and throws: convert it
// with .to(DType::f32) first, or use safetensors.
void save_npy(const std::string& path, const Tensor& t);

}  // namespace accrue

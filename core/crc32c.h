// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected; the checksum of
// iSCSI, ext4 and Snappy framing): what accrue's tensor files record per tensor
// (Note [Tensor checksums] in core/safetensors.cpp).
//
//   uint32_t c = accrue::crc32c(data, n);          // crc32c("123456789") == 0xE3069283
//   uint32_t d = accrue::crc32c(more, m, c);       // == crc32c of data followed by more
//
// On x86-64 CPUs with SSE4.2 the CRC32 instruction computes it (several GB/s
// per core); elsewhere a table-driven slicing-by-8 loop does, with the same
// results.
#pragma once

#include <cstddef>
#include <cstdint>

namespace accrue {

// The CRC32C of n bytes at data; `previous` is the CRC32C of the bytes before
// them (0 for none), so a long buffer can be checksummed in pieces.
uint32_t crc32c(const void* data, size_t n, uint32_t previous = 0);

// The same, always with the portable table-driven loop (for tests and the
// benchmark, which compare it with the instruction).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t previous = 0);

// Which implementation crc32c uses on this CPU: "sse4.2" or "slicing-by-8".
const char* crc32c_implementation();

}  // namespace accrue

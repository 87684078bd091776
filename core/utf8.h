// UTF-8 validation and encoding for the safetensors header (core/json.h) and
// its writer. Internal to core/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace accrue::detail {

// Offset of the first byte of s that is not valid UTF-8, or npos. Overlong
// forms, surrogates and code points past U+10FFFF are invalid.
size_t find_invalid_utf8(const std::string& s);

// Appends the UTF-8 encoding of the code point cp (at most U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace accrue::detail

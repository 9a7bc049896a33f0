// Parsing a decimal number without the C library's locale-aware, errno-setting strtoull, for the
// allocator's own option and control-name parsers.
#pragma once

#include <cstdint>

namespace meshalloc {

// Reads the decimal digits at `cursor`, stopping at `end` (nullptr: at the first non-digit of a
// NUL-terminated string) and advancing past them. False if there is no digit or the number does
// not fit 64 bits (the cursor is then left anywhere in the digits).
inline bool parseDecimal(const char*& cursor, const char* end, uint64_t* value) {
  const char* start = cursor;
  uint64_t result = 0;
  for (; cursor != end && *cursor >= '0' && *cursor <= '9'; cursor++) {
    uint64_t digit = static_cast<uint64_t>(*cursor - '0');
    if (result > (UINT64_MAX - digit) / 10) return false;
    result = result * 10 + digit;
  }
  if (cursor == start) return false;
  *value = result;
  return true;
}

}  // namespace meshalloc

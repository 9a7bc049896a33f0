// The thesis's check for the handle tests (§3.4): every object filled with a pattern derived
// from its handle, so that an object moved wrong, or two objects sharing a slot, show up as
// bytes that differ from it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "handle/handles.h"

namespace meshalloc::handles::patterns {

inline uint8_t patternByte(uint64_t handle, size_t i) {
  uint64_t x = (handle ^ (i / 8)) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> (8 * (i % 8)));
}

inline void fill(uint64_t handle, size_t size) {
  auto* p = static_cast<uint8_t*>(pin(handle));
  for (size_t i = 0; i < size; i++) p[i] = patternByte(handle, i);
  unpin(handle);
}

// The number of bytes that differ from the pattern.
inline size_t mismatches(uint64_t handle, size_t size) {
  auto* p = static_cast<const uint8_t*>(pin(handle));
  size_t wrong = 0;
  for (size_t i = 0; i < size; i++) wrong += p[i] != patternByte(handle, i);
  unpin(handle);
  return wrong;
}

}  // namespace meshalloc::handles::patterns

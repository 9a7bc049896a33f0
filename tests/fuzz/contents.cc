#include "contents.h"

namespace meshalloc::fuzz {
namespace {

constexpr size_t kPage = 4096;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint8_t byteAt(uint64_t seed, size_t i) {
  return static_cast<uint8_t>((seed >> 8) + i * (seed | 1) + (i >> 8) * 0x3B);
}

// Calls visit(begin, end) for the checked ranges of a block of `size` bytes, clipped to `limit`;
// stops early when visit returns false.
template <typename Visit>
void forEachCheckedRange(size_t size, size_t limit, Visit visit) {
  size_t end = size < limit ? size : limit;
  if (size <= kFullCheckBytes) {
    if (end) visit(size_t{0}, end);
    return;
  }
  for (size_t page = 0; page < end; page += kPage) {
    size_t length = page == 0 ? kPage : 64;
    if (!visit(page, page + length < end ? page + length : end)) return;
  }
  size_t tail = size - kPage;
  if (tail < end) visit(tail, end);
}

}  // namespace

// Neighbouring bytes differ, and so do blocks, sizes and the 256-byte periods of one block.
uint64_t seedOf(uint64_t id, size_t size) {
  return mix(id * 0x100000001B3ull ^ size);
}

uint8_t patternByte(uint64_t seed, size_t i) {
  return byteAt(seed, i);
}

void fill(void* block, size_t size, uint64_t seed) {
  uint8_t* bytes = static_cast<uint8_t*>(block);
  forEachCheckedRange(size, size, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) bytes[i] = byteAt(seed, i);
    return true;
  });
}

size_t firstWrongByte(const void* block, size_t size, uint64_t seed, size_t limit) {
  const uint8_t* bytes = static_cast<const uint8_t*>(block);
  size_t wrong = SIZE_MAX;
  forEachCheckedRange(size, limit, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      if (bytes[i] != byteAt(seed, i)) {
        wrong = i;
        return false;
      }
    }
    return true;
  });
  return wrong;
}

size_t firstNonZeroByte(const void* block, size_t size) {
  const uint8_t* bytes = static_cast<const uint8_t*>(block);
  size_t wrong = SIZE_MAX;
  forEachCheckedRange(size, size, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      if (bytes[i] != 0) {
        wrong = i;
        return false;
      }
    }
    return true;
  });
  return wrong;
}

}  // namespace meshalloc::fuzz

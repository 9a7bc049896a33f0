// The heap fuzzer's block contents: every live block holds a pattern derived from its id and
// size. Blocks up to kFullCheckBytes are filled and checked entirely; larger ones at their head
// and tail and in the first bytes of every page (each page must keep its own contents).
// contents.cc is compiled without coverage or ASan instrumentation in the fuzzer: these loops
// are most of a program's time and the blocks are meshalloc's memory, which ASan does not track.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc::fuzz {

constexpr size_t kFullCheckBytes = 16 * 1024;  // kMaxSmallSize: every small block in full

// The pattern's seed for block `id` of `size` bytes, and its byte at offset `i`.
uint64_t seedOf(uint64_t id, size_t size);
uint8_t patternByte(uint64_t seed, size_t i);

void fill(void* block, size_t size, uint64_t seed);
// The first checked byte below min(size, limit) that does not hold the pattern, or SIZE_MAX.
size_t firstWrongByte(const void* block, size_t size, uint64_t seed, size_t limit);
// The first checked byte that is not zero, or SIZE_MAX.
size_t firstNonZeroByte(const void* block, size_t size);

}  // namespace meshalloc::fuzz

// Free blocks carry a tag in their second word, so that a second free of one is noticed from the
// block alone (heap::deallocate), as glibc's tcache key does: looking the block up on every free
// cost more than the free itself, and the span's metadata is a cache miss in a large heap. One
// random value per process (set at start-up), with two bits telling where the block went
// (neither, the released bit, or both):
//   recycledTag()  among a thread's recycled blocks (ShuffleVector's ring);
//   vectorTag()    in a shuffle vector: freed locally, or claimed by a refill from a span whose
//                  slots have been handed out before;
//   releasedTag()  freed into an attached span's remote-free stack or, by its owner, into its
//                  bitmap.
// A block handed to the program has its tag word cleared (SlotStack::pop, RecycledRing::untag),
// so a live block carries a tag only if the program stored that random value itself. Blocks
// freed into detached spans are not tagged: a mesh pass may be copying those pages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

constexpr uintptr_t kVectorTagBit = 2;
constexpr uintptr_t kReleasedTagBit = 4;
// Read by every free and refill on every thread, written once at start-up: a line of their own,
// or a lock the linker places beside them (as it did: GlobalHeap's large-object lock, the
// reclaim and registry locks) turns each of those reads into a miss whenever another thread
// takes the lock.
struct alignas(64) CacheTags {
  // Odd, so never an aligned pointer a program would leave in a freed block; bits 1 and 2 clear.
  uintptr_t cache = 1;
  // `cache` with both bits set: the vector tag, and what any tag becomes with both bits set, so
  // that the local free tests and writes the one value it loads (setCacheTags sets both).
  uintptr_t vector = 1 | kVectorTagBit | kReleasedTagBit;
};
inline CacheTags gCacheTags;
inline void setCacheTags(uintptr_t random) {
  gCacheTags.cache = (random | 1) & ~(kVectorTagBit | kReleasedTagBit);
  gCacheTags.vector = gCacheTags.cache | kVectorTagBit | kReleasedTagBit;
}
constexpr size_t kCacheTagWord = 1;  // every class's blocks have at least two words

inline uintptr_t cacheTagOf(uintptr_t block) {
  return reinterpret_cast<const uintptr_t*>(block)[kCacheTagWord];
}
inline void setCacheTag(uintptr_t block, uintptr_t tag) {
  reinterpret_cast<uintptr_t*>(block)[kCacheTagWord] = tag;
}
inline uintptr_t recycledTag() {
  return gCacheTags.cache;
}
inline uintptr_t vectorTag() {
  return gCacheTags.vector;
}
inline uintptr_t releasedTag() {
  return gCacheTags.cache | kReleasedTagBit;
}
// Any of the three: the block may be free already (the slow path finds out).
inline bool isCacheTagged(uintptr_t block) {
  return (cacheTagOf(block) | kVectorTagBit | kReleasedTagBit) == gCacheTags.vector;
}

}  // namespace meshalloc

// Small-object size classes: 16-byte steps up to 128 B, then four classes per doubling up to
// 16 KiB (as jemalloc does), so internal fragmentation stays under 25 % everywhere and usually
// far below; plus 9/8 of each power of two from 512 B to 8 KiB, because C programs often ask for
// a power of two plus a small header (sqlite adds 8 bytes to every request: its 1032-byte and
// 4368-byte blocks wasted 24 % and 17 % in the classes above them). Only five classes, not eight
// per doubling: every class in use costs a small program partly used spans of its own. Span
// sizes depend on the run-time page size and are planned at start-up.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

constexpr size_t kMinAlignment = 16;  // alignof(max_align_t) on x86-64 and AArch64
constexpr size_t kMaxSmallSize = 16384;
constexpr size_t kMinObjectsPerSpan = 8;
// Spans are at least this large so mid-size classes still hold enough objects per span that
// refills (and the locking they need) stay rare.
constexpr size_t kMinSpanBytes = 4096;
// Spans also hold this many objects where that takes at most kPreferredSpanBytesCap: a span
// of a few mid-size objects costs a span record (a cache miss) per few slots in a sparse heap, and
// a mesh, whose cost is its system calls, gives back only its bytes (docs/heap.md).
constexpr size_t kPreferredObjectsPerSpan = 64;
constexpr size_t kPreferredSpanBytesCap = 16384;
// A span is grown page by page while its unused tail exceeds 1/kTailWasteDivisor of it.
constexpr size_t kTailWasteDivisor = 32;
constexpr size_t kMaxSpanGrowthFactor = 4;
// A small span's pages are indexed in 8 bits of its page-map entries (see PageEntry).
constexpr size_t kMaxSpanPages = 255;

constexpr uint32_t kSizeClassSizes[] = {
    16,    32,    48,   64,   80,   96,   112,  128,                            // 16-byte steps
    160,   192,   224,  256,  320,  384,  448,  512,                            // 4 per doubling
    576,   640,   768,  896,  1024, 1152, 1280, 1536, 1792, 2048,  2304, 2560,  // and 9/8 of
    3072,  3584,  4096, 4608, 5120, 6144, 7168, 8192, 9216, 10240,              // each power
    12288, 14336, 16384};
constexpr size_t kNumSizeClasses = sizeof(kSizeClassSizes) / sizeof(kSizeClassSizes[0]);
constexpr uint8_t kLargeClass = 0xff;
static_assert(kNumSizeClasses < kLargeClass);
static_assert(kSizeClassSizes[kNumSizeClasses - 1] == kMaxSmallSize);

// The class of each small size, by (size + kMinAlignment - 1) / kMinAlignment: SizeClasses::classOf
// reads it, and malloc's table of vector offsets (heap/thread_heap.h) is built from it. Computed at
// compile time, so it is there before init() and costs no start-up work.
struct ClassBySize {
  static constexpr size_t kCount = kMaxSmallSize / kMinAlignment + 1;
  uint8_t classes[kCount];
};
inline constexpr ClassBySize kClassBySize = [] {
  ClassBySize table{};
  unsigned c = 0;
  for (size_t i = 0; i < ClassBySize::kCount; i++) {
    while (kSizeClassSizes[c] < i * kMinAlignment) c++;
    table.classes[i] = static_cast<uint8_t>(c);
  }
  return table;
}();

struct SpanPlan {
  uint32_t objectSize;
  uint32_t pages;
  uint32_t objectCount;
  // ceil(2^32 / objectSize): (delta * reciprocal) >> 32 == delta / objectSize for every multiple
  // of objectSize below 2^32, which is all a valid free needs; anything else is caught by the
  // multiply-back check.
  uint32_t reciprocal;
  // The slot-start test in one multiply and one comparison: with slotMultiplier = floor(2^64 /
  // objectSize) + 1, slotMultiplier * objectSize = 2^64 + e for some e in [1, objectSize], so
  // modulo 2^64 the product of delta and slotMultiplier is k * e for the k-th slot's start and at
  // least slotMultiplier (2^50 and more) for any other delta below 2^40. It is below
  // slotLimit = objectCount * e exactly at the starts of slots 0 .. objectCount - 1: the test
  // rejects interior pointers, the unused tail and everything past it at once. (A test for a
  // multiple alone, Lemire, Kaser and Kurz's "Faster remainder by direct computation", 2019,
  // needed a second comparison with the end of the last slot.)
  uint64_t slotMultiplier;
  uint32_t slotLimit;

  // Whether `delta` bytes into a span (below 2^40) is a slot's start, from the two fields above
  // (the shuffle vector keeps copies of them for the inline free).
  static bool isSlotStart(uint64_t slotLimit, uint64_t slotMultiplier, uintptr_t delta) {
    return static_cast<uint64_t>(delta) * slotMultiplier < slotLimit;
  }
};

class SizeClasses {
 public:
  static void init(size_t pageSize);

  static unsigned classOf(size_t size) {
    return kClassBySize.classes[(size + kMinAlignment - 1) / kMinAlignment];
  }
  static const SpanPlan& plan(unsigned sizeClass) { return plans_[sizeClass]; }
  // Slot index of `delta` bytes into a span of `sizeClass`, or -1 if it is not a slot start.
  static int64_t slotOf(unsigned sizeClass, uintptr_t delta) {
    const SpanPlan& p = plans_[sizeClass];
    uint64_t slot = (static_cast<uint64_t>(delta) * p.reciprocal) >> 32;
    if (slot * p.objectSize != delta || slot >= p.objectCount) return -1;
    return static_cast<int64_t>(slot);
  }
  // slotOf(sizeClass, delta) >= 0 for a delta within the span, without computing the slot: the
  // free fast path needs only the answer (one multiply instead of two in a row).
  static bool isSlotStart(unsigned sizeClass, uintptr_t delta) {
    const SpanPlan& p = plans_[sizeClass];
    return SpanPlan::isSlotStart(p.slotLimit, p.slotMultiplier, delta);
  }
  static size_t maxObjectsPerSpan() { return maxObjects_; }

  // Smallest class whose size is at least `size` and whose objects are all aligned to
  // `alignment` (a power of two) given a page-aligned span; returns kLargeClass if none.
  static unsigned classForAlignment(size_t size, size_t alignment);

 private:
  static inline SpanPlan plans_[kNumSizeClasses];
  static inline size_t maxObjects_ = 0;
};

}  // namespace meshalloc

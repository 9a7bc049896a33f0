#include "heap/size_class.h"

namespace meshalloc {

namespace {

uint32_t planPages(uint32_t objectSize, size_t pageSize) {
  size_t minBytes = kMinObjectsPerSpan * objectSize > kMinSpanBytes
                        ? kMinObjectsPerSpan * objectSize
                        : kMinSpanBytes;
  size_t preferred = kPreferredObjectsPerSpan * objectSize;
  if (preferred > kPreferredSpanBytesCap) preferred = kPreferredSpanBytesCap;
  if (preferred > minBytes) minBytes = preferred;
  size_t minPages = (minBytes + pageSize - 1) / pageSize;
  if (minPages == 0) minPages = 1;
  size_t bestPages = minPages;
  size_t bestWaste = pageSize * minPages;
  for (size_t pages = minPages; pages <= minPages * kMaxSpanGrowthFactor; pages++) {
    size_t bytes = pages * pageSize;
    size_t waste = bytes % objectSize;
    if (waste * kTailWasteDivisor <= bytes && pages <= kMaxSpanPages)
      return static_cast<uint32_t>(pages);
    // Compare waste as a fraction of the span: waste/bytes < bestWaste/bestBytes.
    if (waste * (bestPages * pageSize) < bestWaste * bytes) {
      bestPages = pages;
      bestWaste = waste;
    }
  }
  return static_cast<uint32_t>(bestPages < kMaxSpanPages ? bestPages : kMaxSpanPages);
}

}  // namespace

void SizeClasses::init(size_t pageSize) {
  maxObjects_ = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    SpanPlan& p = plans_[c];
    p.objectSize = kSizeClassSizes[c];
    p.pages = planPages(p.objectSize, pageSize);
    p.objectCount = static_cast<uint32_t>(p.pages * pageSize / p.objectSize);
    p.reciprocal = static_cast<uint32_t>(((1ull << 32) + p.objectSize - 1) / p.objectSize);
    // floor(2^64 / size) + 1, and e = slotMultiplier * size - 2^64 (see SpanPlan).
    bool powerOfTwo = (p.objectSize & (p.objectSize - 1)) == 0;
    p.slotMultiplier = UINT64_MAX / p.objectSize + (powerOfTwo ? 2 : 1);
    uint32_t excess = static_cast<uint32_t>(p.slotMultiplier * p.objectSize);
    p.slotLimit = p.objectCount * excess;
    if (p.objectCount > maxObjects_) maxObjects_ = p.objectCount;
  }
}

unsigned SizeClasses::classForAlignment(size_t size, size_t alignment) {
  if (size > kMaxSmallSize) return kLargeClass;
  for (unsigned c = classOf(size); c < kNumSizeClasses; c++) {
    if (kSizeClassSizes[c] % alignment == 0) return c;
  }
  return kLargeClass;
}

}  // namespace meshalloc

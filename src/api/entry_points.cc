#include "api/entry_points.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "api/stats.h"
#include "heap/arena.h"
#include "heap/heap.h"
#include "mesh/policy.h"
#include "support/text_writer.h"

namespace meshalloc::api {

namespace {

// glibc raises alignments below its minimum chunk size to that size; ours is kMinAlignment.
constexpr size_t kMaxAlignment = SIZE_MAX / 2 + 1;
// glibc's M_MXFAST upper bound: 80 * sizeof(size_t) / 4.
constexpr int kMaxFastBinSize = 80 * static_cast<int>(sizeof(size_t)) / 4;

bool isPowerOfTwo(size_t value) {
  return value && !(value & (value - 1));
}

size_t nextPowerOfTwo(size_t value) {
  size_t result = 1;
  while (result < value) result <<= 1;
  return result;
}

int saturate(size_t value) {
  return value > INT_MAX ? INT_MAX : static_cast<int>(value);
}

}  // namespace

void* mallocImpl(size_t size) {
  return heap::allocate(size);
}

void freeImpl(void* pointer) {
  heap::deallocate(pointer);
}

void* callocImpl(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return heap::allocateZeroed(bytes);
}

void* reallocImpl(void* pointer, size_t size) {
  if (!pointer) return heap::allocate(size);
  if (size == 0) {  // glibc frees and returns NULL (REALLOC_ZERO_BYTES_FREES)
    heap::deallocate(pointer);
    return nullptr;
  }
  return heap::reallocate(pointer, size);
}

void* reallocarrayImpl(void* pointer, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return reallocImpl(pointer, bytes);
}

void* memalignImpl(size_t alignment, size_t size) {
  // glibc 2.36: alignments above SIZE_MAX/2+1 are EINVAL; others round up to a power of two.
  if (alignment > kMaxAlignment) {
    errno = EINVAL;
    return nullptr;
  }
  if (!isPowerOfTwo(alignment)) alignment = nextPowerOfTwo(alignment);
  return heap::allocateAligned(size, alignment);
}

int posixMemalignImpl(void** result, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || !isPowerOfTwo(alignment / sizeof(void*))) return EINVAL;
  void* block = heap::allocateAligned(size, alignment);
  if (!block) return ENOMEM;
  *result = block;
  return 0;
}

void* alignedAllocImpl(size_t alignment, size_t size) {
  return memalignImpl(alignment, size);
}

void* vallocImpl(size_t size) {
  return heap::allocateAligned(size, Arena::pageSize());
}

void* pvallocImpl(size_t size) {
  size_t page = Arena::pageSize();
  size_t rounded;
  if (__builtin_add_overflow(size, page - 1, &rounded)) {
    errno = ENOMEM;
    return nullptr;
  }
  rounded &= ~(page - 1);
  return heap::allocateAligned(rounded ? rounded : page, page);
}

int trimImpl(size_t /*pad: we never keep a top chunk to pad*/) {
  heap::flushThreadCache();
  return heap::releaseFreeMemory() > 0 ? 1 : 0;
}

struct mallinfo2 mallinfo2Impl() {
  HeapStats s = collectStats();
  struct mallinfo2 info = {};
  info.arena = s.active - s.largeAllocated + s.retained;  // small-object spans and cached pages
  info.ordblks = s.segments;
  info.hblks = s.largeCount;
  info.hblkhd = s.largeAllocated;
  info.uordblks = s.allocated;
  info.fordblks = s.active + s.retained - s.allocated;
  info.keepcost = s.retained;
  return info;
}

struct mallinfo mallinfoImpl() {
  struct mallinfo2 wide = mallinfo2Impl();
  struct mallinfo info = {};
  info.arena = saturate(wide.arena);
  info.ordblks = saturate(wide.ordblks);
  info.hblks = saturate(wide.hblks);
  info.hblkhd = saturate(wide.hblkhd);
  info.uordblks = saturate(wide.uordblks);
  info.fordblks = saturate(wide.fordblks);
  info.keepcost = saturate(wide.keepcost);
  return info;
}

int malloptImpl(int parameter, int value) {
  // Every glibc tunable is accepted (meshalloc has its own), with glibc's one range check.
  if (parameter == M_MXFAST && (value < 0 || value > kMaxFastBinSize)) return 0;
  return 1;
}

void statsImpl() {
  writeStats(STDERR_FILENO, false);
}

int infoImpl(int options, FILE* stream) {
  if (options != 0) return EINVAL;  // glibc returns the error number itself
  HeapStats s = collectStats();
  char buffer[8192];
  TextWriter out(buffer, sizeof(buffer));
  out.text("<malloc version=\"meshalloc-1\">\n<heap nr=\"0\">\n<sizes>\n");
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    if (!s.classes[c].spans) continue;
    out.text("  <size from=\"").unsignedValue(c ? kSizeClassSizes[c - 1] + 1 : 1).text("\" to=\"");
    out.unsignedValue(kSizeClassSizes[c])
        .text("\" total=\"")
        .unsignedValue(s.classes[c].liveObjects);
    out.text("\" count=\"").unsignedValue(s.classes[c].spans).text("\"/>\n");
  }
  out.text("</sizes>\n<total type=\"mmap\" count=\"")
      .unsignedValue(s.largeCount)
      .text("\" size=\"");
  out.unsignedValue(s.largeAllocated)
      .text("\"/>\n<system type=\"current\" size=\"")
      .unsignedValue(s.mapped);
  out.text("\"/>\n<aspace type=\"total\" size=\"")
      .unsignedValue(s.reserved)
      .text("\"/>\n</heap>\n");
  out.text("<total type=\"mmap\" count=\"")
      .unsignedValue(s.largeCount)
      .text("\" size=\"")
      .unsignedValue(s.largeAllocated);
  out.text("\"/>\n<system type=\"current\" size=\"").unsignedValue(s.mapped).text("\"/>\n");
  out.text("<aspace type=\"total\" size=\"").unsignedValue(s.reserved).text("\"/>\n</malloc>\n");
  // stdio may allocate; none of our locks are held here.
  fwrite(out.data(), 1, out.length(), stream);
  return 0;
}

size_t compactImpl() {
  if (!heap::ensureInitialized()) return 0;
  MeshPolicy::init();
  // The caller's own spans are detached first so that they can take part.
  heap::flushThreadCache();
  size_t released = gHeapConfig.meshing ? MeshPolicy::compactNow() : 0;
  return released + heap::releaseFreeMemory();
}

}  // namespace meshalloc::api

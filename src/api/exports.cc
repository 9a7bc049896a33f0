// The exported C symbols: glibc's allocation API and meshalloc's own control interface. Only
// this file and cxx_operators.cc give symbols default visibility.
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <unistd.h>

#include "api/ctl.h"
#include "api/entry_points.h"
#include "api/export.h"
#include "api/libc_buffers.h"
#include "api/live_stats.h"
#include "api/stats.h"
#include "handle/handles.h"
#include "heap/config.h"
#include "heap/heap.h"
#include "mesh/policy.h"
#include "meshalloc.h"

using namespace meshalloc;

namespace {
// Out of line, entered by a tail call: malloc's fast path then saves no register. It passes the
// return address as its offset in gLibcBufferCallerSpan, the difference its test computed, and
// the address is rebuilt here: passing the address itself kept a copy of it in malloc (one
// instruction on every call). The span is set once, at load (api::findLibcBufferCallers).
__attribute__((noinline)) void* mallocFromNearLibcBufferFunction(size_t size,
                                                                 uintptr_t callerOffset) {
  const void* returnAddress =
      reinterpret_cast<const void*>(callerOffset + api::gLibcBufferCallerSpan.start);
  if (api::calledFromLibcBufferFunction(returnAddress)) return heap::allocatePinned(size);
  return heap::allocate(size);
}
}  // namespace

MESHALLOC_EXPORT void* malloc(size_t size) {
  // The caller alone decides, without looking at the size first: a size test ahead of it was a
  // branch the CPU mispredicted on every other call of programs whose sizes straddle the
  // threshold (larson: 14 % slower), while the caller test is always false for a program's
  // own calls. The difference from the range's start is kept: the exact test adds it back.
  uintptr_t callerOffset =
      reinterpret_cast<uintptr_t>(__builtin_return_address(0)) - api::gLibcBufferCallerSpan.start;
  if (__builtin_expect(callerOffset < api::gLibcBufferCallerSpan.size, 0))
    return mallocFromNearLibcBufferFunction(size, callerOffset);
  return heap::allocate(size);
}
MESHALLOC_EXPORT void free(void* pointer) {
  heap::deallocate(pointer);
}
MESHALLOC_EXPORT void cfree(void* pointer) {
  heap::deallocate(pointer);
}
MESHALLOC_EXPORT void* calloc(size_t count, size_t size) {
  return api::callocImpl(count, size);
}
MESHALLOC_EXPORT void* realloc(void* pointer, size_t size) {
  return api::reallocImpl(pointer, size);
}
MESHALLOC_EXPORT void* reallocarray(void* pointer, size_t count, size_t size) {
  return api::reallocarrayImpl(pointer, count, size);
}
MESHALLOC_EXPORT void* memalign(size_t alignment, size_t size) {
  return api::memalignImpl(alignment, size);
}
MESHALLOC_EXPORT int posix_memalign(void** result, size_t alignment, size_t size) {
  return api::posixMemalignImpl(result, alignment, size);
}
MESHALLOC_EXPORT void* aligned_alloc(size_t alignment, size_t size) {
  return api::alignedAllocImpl(alignment, size);
}
MESHALLOC_EXPORT void* valloc(size_t size) {
  return api::vallocImpl(size);
}
MESHALLOC_EXPORT void* pvalloc(size_t size) {
  return api::pvallocImpl(size);
}
MESHALLOC_EXPORT size_t malloc_usable_size(void* pointer) {
  return heap::usableSize(pointer);
}
MESHALLOC_EXPORT int malloc_trim(size_t pad) {
  return api::trimImpl(pad);
}
MESHALLOC_EXPORT struct mallinfo mallinfo() {
  return api::mallinfoImpl();
}
MESHALLOC_EXPORT struct mallinfo2 mallinfo2() {
  return api::mallinfo2Impl();
}
MESHALLOC_EXPORT int mallopt(int parameter, int value) {
  return api::malloptImpl(parameter, value);
}
MESHALLOC_EXPORT void malloc_stats() {
  api::statsImpl();
}
MESHALLOC_EXPORT int malloc_info(int options, FILE* stream) {
  return api::infoImpl(options, stream);
}

MESHALLOC_EXPORT int meshalloc_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                                       size_t newlen) {
  return api::control(name, oldp, oldlenp, newp, newlen);
}
// jemalloc's name, so that jemalloc-aware programs keep working under LD_PRELOAD.
MESHALLOC_EXPORT int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                             size_t newlen) {
  return api::control(name, oldp, oldlenp, newp, newlen);
}
MESHALLOC_EXPORT size_t meshalloc_compact(void) {
  return api::compactImpl();
}
MESHALLOC_EXPORT void meshalloc_print_stats(int fd, int json) {
  api::writeStats(fd, json != 0);
}

namespace {

// Programs often close stderr before exiting (coreutils' close_stdout does): the report goes
// to a duplicate of the stderr the program started with.
constexpr int kLowestSavedFd = 64;
int gSavedStderr = -1;

__attribute__((constructor)) void initializeAtLoad() {
  api::findLibcBufferCallers();
  if (heap::ensureInitialized()) MeshPolicy::init();
  // Before the program's threads exist: the fork participants are changed only at start-up.
  handles::ensureInitialized();
  api::startLiveStats();
  if (gHeapConfig.statsAtExit != StatsFormat::kNone && !gHeapConfig.statsFile) {
    gSavedStderr = os::duplicateFd(STDERR_FILENO, kLowestSavedFd);
  }
}

__attribute__((destructor)) void printStatsAtExit() {
  api::stopLiveStats();
  if (gHeapConfig.statsAtExit == StatsFormat::kNone) return;
  int fd = gSavedStderr >= 0 ? gSavedStderr : STDERR_FILENO;
  if (gHeapConfig.statsFile) {
    static char path[PATH_MAX];  // static: destructors may run on a small stack
    if (!api::expandStatsPath(gHeapConfig.statsFile, os::processId(), path, sizeof(path))) return;
    fd = os::createFile(path, os::FileCreation::kReplace);
    if (fd < 0) return;
  }
  api::writeStats(fd, gHeapConfig.statsAtExit == StatsFormat::kJson);
  if (fd != STDERR_FILENO) os::closeFd(fd);
  gSavedStderr = -1;
}

}  // namespace

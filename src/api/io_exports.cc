// System calls that write into user memory, wrapped so that meshing never makes them fail.
// The kernel does not take a SIGSEGV when it copies into a write-protected page: the call
// fails with EFAULT. So a call whose buffer lies in the heap publishes the buffer for its
// duration (the mesher leaves spans that overlap a published buffer alone), waits out a
// barrier that is already up, and, should fork's snapshot barrier (which protects every
// meshed span) catch it anyway, retries once the barrier is down. The real functions are
// glibc's, found with dlsym(RTLD_NEXT), so cancellation points and errno behave as usual.
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>

#include "heap/arena.h"
#include "heap/heap.h"
#include "heap/thread_heap.h"
#include "mesh/write_barrier.h"

#define MESHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace meshalloc {
namespace {

template <typename Function>
Function realFunction(std::atomic<Function>& cache, const char* name) {
  Function f = cache.load(std::memory_order_acquire);
  if (!f) {
    f = reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
    cache.store(f, std::memory_order_release);
  }
  return f;
}

bool inHeap(uintptr_t start, uintptr_t end) {
  return Arena::contains(start) || Arena::contains(end - 1);
}

template <typename Call>
ssize_t guarded(const void* buffer, size_t length, Call call) {
  uintptr_t start = reinterpret_cast<uintptr_t>(buffer);
  uintptr_t end = start + length;
  if (length == 0 || end < start || !inHeap(start, end)) return call();
  // A thread that never allocated still needs a record to publish its buffer in.
  ThreadHeap* heap = heap::currentThreadHeap();
  if (!heap) return call();
  ThreadActivity& activity = heap->activity();
  // A nested call (from a signal handler) keeps the outer buffer published: both stay safe
  // only if the outer one does, and the outer call republishes nothing on return.
  if (activity.ioBufferEnd.load(std::memory_order_relaxed) != 0) return call();
  for (;;) {
    activity.ioBufferStart.store(start, std::memory_order_seq_cst);
    activity.ioBufferEnd.store(end, std::memory_order_seq_cst);
    uint32_t sequence = WriteBarrier::sequence();
    if (sequence & 1) {
      activity.ioBufferEnd.store(0, std::memory_order_seq_cst);
      WriteBarrier::waitForEnd(sequence);
      continue;
    }
    ssize_t result = call();
    int error = errno;
    activity.ioBufferEnd.store(0, std::memory_order_release);
    if (result < 0 && error == EFAULT && WriteBarrier::sequence() != sequence) {
      uint32_t now = WriteBarrier::sequence();
      if (now & 1) WriteBarrier::waitForEnd(now);
      continue;
    }
    errno = error;
    return result;
  }
}

using ReadFn = ssize_t (*)(int, void*, size_t);
using PreadFn = ssize_t (*)(int, void*, size_t, off_t);
using RecvFn = ssize_t (*)(int, void*, size_t, int);
using RecvfromFn = ssize_t (*)(int, void*, size_t, int, struct sockaddr*, socklen_t*);
std::atomic<ReadFn> gRead{nullptr};
std::atomic<PreadFn> gPread{nullptr};
std::atomic<PreadFn> gPread64{nullptr};
std::atomic<RecvFn> gRecv{nullptr};
std::atomic<RecvfromFn> gRecvfrom{nullptr};

}  // namespace
}  // namespace meshalloc

using namespace meshalloc;

MESHALLOC_EXPORT ssize_t read(int fd, void* buffer, size_t count) {
  ReadFn real = realFunction(gRead, "read");
  return guarded(buffer, count, [&] { return real(fd, buffer, count); });
}

MESHALLOC_EXPORT ssize_t pread(int fd, void* buffer, size_t count, off_t offset) {
  PreadFn real = realFunction(gPread, "pread");
  return guarded(buffer, count, [&] { return real(fd, buffer, count, offset); });
}

MESHALLOC_EXPORT ssize_t pread64(int fd, void* buffer, size_t count, off_t offset) {
  PreadFn real = realFunction(gPread64, "pread64");
  return guarded(buffer, count, [&] { return real(fd, buffer, count, offset); });
}

MESHALLOC_EXPORT ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  RecvFn real = realFunction(gRecv, "recv");
  return guarded(buffer, length, [&] { return real(fd, buffer, length, flags); });
}

MESHALLOC_EXPORT ssize_t recvfrom(int fd, void* buffer, size_t length, int flags,
                                  struct sockaddr* address, socklen_t* addressLength) {
  RecvfromFn real = realFunction(gRecvfrom, "recvfrom");
  return guarded(buffer, length,
                 [&] { return real(fd, buffer, length, flags, address, addressLength); });
}

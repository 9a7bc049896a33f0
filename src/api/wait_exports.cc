// Condition-variable waits as the application sees them: the thread parks its heap for the
// duration of the wait, so that a thread that stays blocked (a server's idle pool thread) gives
// its spans back to the background thread after idle_reclaim_ms (ThreadHeap::park). These waits
// are not async-signal-safe, so none of them runs in a signal handler that interrupted one of
// our own operations: the heap is never parked in the middle of a malloc or a free.
// The real functions are glibc's default versions, found with dlsym(RTLD_NEXT).
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <atomic>

#include "api/export.h"
#include "api/next_symbol.h"
#include "heap/thread_heap.h"

namespace meshalloc {
namespace {

// Runs `wait` with the calling thread's heap parked. Cancellation (these waits are cancellation
// points) skips the unpark: the thread-exit handler resumes the heap instead.
template <typename Wait>
int parked(Wait wait) {
  ThreadHeap* heap = ThreadHeap::park();
  int result = wait();
  ThreadHeap::unpark(heap);
  return result;
}

}  // namespace
}  // namespace meshalloc

using namespace meshalloc;

MESHALLOC_EXPORT int pthread_cond_wait(pthread_cond_t* condition, pthread_mutex_t* mutex) {
  auto real = MESHALLOC_NEXT_SYMBOL(pthread_cond_wait);
  if (!real) return ENOSYS;
  return parked([&] { return real(condition, mutex); });
}

MESHALLOC_EXPORT int pthread_cond_timedwait(pthread_cond_t* condition, pthread_mutex_t* mutex,
                                            const struct timespec* deadline) {
  auto real = MESHALLOC_NEXT_SYMBOL(pthread_cond_timedwait);
  if (!real) return ENOSYS;
  return parked([&] { return real(condition, mutex, deadline); });
}

MESHALLOC_EXPORT int pthread_cond_clockwait(pthread_cond_t* condition, pthread_mutex_t* mutex,
                                            clockid_t clock, const struct timespec* deadline) {
  auto real = MESHALLOC_NEXT_SYMBOL(pthread_cond_clockwait);
  if (!real) return ENOSYS;
  return parked([&] { return real(condition, mutex, clock, deadline); });
}

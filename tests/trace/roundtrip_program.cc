// The program tests/trace/trace_test.cc records: a known sequence of allocator calls, so the
// test can check that the decoded trace holds exactly those events, per thread, in order.
// Sizes 1001..1999 mark the main thread's calls, 2000..2049 the workers', 3001/3002 the fork's.
// Built with -fno-builtin so that the compiler keeps every call (it may drop a malloc/free pair).
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <new>

namespace {

constexpr int kWorkers = 3;
constexpr int kBlocksPerWorker = 50;
void* gSlots[kWorkers][kBlocksPerWorker];
pthread_barrier_t gBarrier;

// Each worker allocates its blocks, waits for the others, then frees the next worker's blocks:
// every free is a cross-thread free.
void* worker(void* argument) {
  int self = static_cast<int>(reinterpret_cast<intptr_t>(argument));
  for (int i = 0; i < kBlocksPerWorker; ++i)
    gSlots[self][i] = malloc(2000 + static_cast<size_t>(i));
  pthread_barrier_wait(&gBarrier);
  for (int i = 0; i < kBlocksPerWorker; ++i) free(gSlots[(self + 1) % kWorkers][i]);
  return nullptr;
}

}  // namespace

int main() {
  void* p = malloc(1001);  // a realloc chain
  p = realloc(p, 1002);
  p = realloc(p, 100003);
  free(p);
  free(calloc(7, 1004));
  free(memalign(64, 1005));
  void* aligned = nullptr;
  if (posix_memalign(&aligned, 256, 1006) != 0) return 1;
  free(aligned);
  free(aligned_alloc(128, 1280));
  free(valloc(1007));
  free(pvalloc(1008));
  void* array = reallocarray(nullptr, 3, 1009);
  array = reallocarray(array, 5, 1009);
  if (malloc_usable_size(array) < 5 * 1009) return 1;
  free(array);
  void* object = ::operator new(1010);
  ::operator delete(object, 1010);
  object = ::operator new[](1011);
  ::operator delete[](object);
  object = ::operator new(1012, std::align_val_t(64));
  ::operator delete(object, std::align_val_t(64));
  object = ::operator new(1013, std::nothrow);
  ::operator delete(object);

  pthread_barrier_init(&gBarrier, nullptr, kWorkers);
  pthread_t threads[kWorkers];
  for (int w = 0; w < kWorkers; ++w) {
    if (pthread_create(&threads[w], nullptr, worker,
                       reinterpret_cast<void*>(static_cast<intptr_t>(w))) != 0)
      return 1;
  }
  for (pthread_t thread : threads) pthread_join(thread, nullptr);

  pid_t child = fork();
  if (child == 0) {
    free(malloc(3001));
    exit(0);  // exit, not _exit: the child's trace gets its footer
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return 1;
  free(malloc(3002));
  return 0;
}

#include "heap_driver.h"

#include "contents.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "api/entry_points.h"
#include "heap/config.h"
#include "heap/heap.h"
#include "heap/size_class.h"
#include "mesh/mesher.h"
#include "mesh/policy.h"

namespace meshalloc::fuzz {
namespace {

// Bounds that keep one program fast and its memory modest.
constexpr size_t kMaxLiveBlocks = 2048;
constexpr size_t kMaxLiveBytes = size_t{48} << 20;
constexpr unsigned kMaxCompactsPerProgram = 4;
constexpr unsigned kMaxForksPerProgram = 1;  // fork copies the page tables: the slowest step
// Blocks up to this size are filled and checked entirely; larger ones at their head and tail
// and at the start of every page (each page must keep its own contents).
constexpr size_t kPage = 4096;

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char* format, ...) {
  va_list args;
  va_start(args, format);
  fputs("heap fuzzer: ", stderr);
  vfprintf(stderr, format, args);
  fputc('\n', stderr);
  va_end(args);
  abort();
}

#define FUZZ_REQUIRE(condition, ...)     \
  do {                                   \
    if (!(condition)) fail(__VA_ARGS__); \
  } while (0)

// Contents (fill, firstWrongByte, firstNonZeroByte, seedOf, patternByte) are in contents.cc.

struct Block {
  void* pointer;
  size_t size;
  uint64_t id;
  size_t alignment;  // what the block was allocated with (1 for none)
};

void checkBlock(const Block& b, const char* when) {
  size_t wrong = firstWrongByte(b.pointer, b.size, seedOf(b.id, b.size), b.size);
  FUZZ_REQUIRE(wrong == SIZE_MAX,
               "block %llu (%p, %zu bytes, alignment %zu) changed at byte %zu %s: 0x%02x, "
               "expected 0x%02x",
               static_cast<unsigned long long>(b.id), b.pointer, b.size, b.alignment, wrong, when,
               static_cast<const uint8_t*>(b.pointer)[wrong],
               patternByte(seedOf(b.id, b.size), wrong));
  size_t usable = heap::usableSize(b.pointer);
  FUZZ_REQUIRE(usable >= b.size, "block %llu (%p): malloc_usable_size %zu < size %zu %s",
               static_cast<unsigned long long>(b.id), b.pointer, usable, b.size, when);
}

// ---- frees on another thread ----------------------------------------------------------------

// One long-lived thread, fed blocks through a queue: it checks each block again (what the
// main thread wrote must be visible here) and frees it, a remote free for the heap.
class RemoteFreer {
 public:
  static RemoteFreer& get() {
    static RemoteFreer* instance = new RemoteFreer;  // never destroyed: outlives every program
    return *instance;
  }
  void push(const Block& b) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(b);
    wake_.notify_one();
  }
  // Returns once every block pushed so far is freed and the thread waits for more.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  RemoteFreer() {
    std::thread([this] { run(); }).detach();
  }
  void run() {
    std::vector<Block> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        busy_ = false;
        idle_.notify_all();
        wake_.wait(lock, [&] { return !queue_.empty(); });
        busy_ = true;
        batch.swap(queue_);
      }
      for (const Block& b : batch) {
        checkBlock(b, "on the freeing thread");
        api::freeImpl(b.pointer);
      }
      batch.clear();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<Block> queue_;
  bool busy_ = true;
};

// ---- the input ------------------------------------------------------------------------------

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return position_ >= size_; }
  uint8_t byte() { return position_ < size_ ? data_[position_++] : 0; }
  uint16_t u16() {
    uint16_t low = byte();  // two statements: the order of reads must not depend on the compiler
    return static_cast<uint16_t>(low | byte() << 8);
  }
  size_t below(size_t bound) { return bound ? u16() % bound : 0; }

  // A request size: 0, small, medium, at a size-class boundary, large, or very large.
  size_t size() {
    uint8_t kind = byte();
    switch (kind % 8) {
      case 0:
        return 0;
      case 1:
        return 1 + below(64);
      case 2:
        return 1 + below(1024);
      case 3:
        return 1 + below(kMaxSmallSize);
      case 4: {
        size_t boundary = kSizeClassSizes[below(kNumSizeClasses)];
        return boundary - 1 + byte() % 3;  // one below, at, one above
      }
      case 5:
        return kMaxSmallSize + 1 + below(256 * 1024);
      case 6:
        return (size_t{256} << 10) + size_t{u16()} * 32;  // up to 2.3 MiB
      default:
        return 1 + byte();
    }
  }
  // A power-of-two alignment from 1 to 4 MiB, small ones more often.
  size_t alignment() {
    uint8_t b = byte();
    return size_t{1} << (b < 192 ? b % 13 : b % 23);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

// ---- the program ----------------------------------------------------------------------------

ProgramStats gTotals;

class Program {
 public:
  explicit Program(Input& in) : in_(in) {}

  void run() {
    while (!in_.empty()) {
      stats_.operations++;
      step();
    }
    for (const Block& b : live_) checkBlock(b, "at the end");
    for (const Block& b : live_) api::freeImpl(b.pointer);
    liveBytes_ = 0;
    live_.clear();
    RemoteFreer::get().drain();
  }
  const ProgramStats& stats() const { return stats_; }

 private:
  enum Op : uint8_t {
    kMalloc,
    kCalloc,
    kRealloc,
    kReallocNull,
    kFree,
    kReallocarray,
    kMemalign,
    kPosixMemalign,
    kAlignedAlloc,
    kValloc,
    kPvalloc,
    kUsableSize,
    kRemoteFree,
    kCompact,
    kFork,
    kImpossible,
    kBurst,
    kTrim,
    kReallocChain,
    kOpCount
  };

  void step() {
    switch (static_cast<Op>(in_.byte() % kOpCount)) {
      case kMalloc: {
        size_t size = in_.size();
        if (!roomFor(size)) return;
        void* p = api::mallocImpl(size);
        adopt(p, size, 1, "malloc");
        return;
      }
      case kCalloc: {
        size_t count = 1 + in_.byte() % 16;
        size_t size = in_.size() / count;
        if (!roomFor(count * size)) return;
        void* p = api::callocImpl(count, size);
        FUZZ_REQUIRE(p, "calloc(%zu, %zu) failed", count, size);
        size_t wrong = firstNonZeroByte(p, count * size);
        FUZZ_REQUIRE(wrong == SIZE_MAX, "calloc(%zu, %zu) = %p: byte %zu is not zero", count, size,
                     p, wrong);
        adopt(p, count * size, 1, "calloc");
        return;
      }
      case kRealloc:
        if (!live_.empty()) reallocate(in_.below(live_.size()), in_.size());
        return;
      case kReallocNull: {
        size_t size = in_.size();
        if (!roomFor(size)) return;
        adopt(api::reallocImpl(nullptr, size), size, 1, "realloc(NULL)");
        return;
      }
      case kFree: {
        if (live_.empty()) {
          api::freeImpl(nullptr);
          return;
        }
        Block b = take(in_.below(live_.size()));
        checkBlock(b, "before free");
        api::freeImpl(b.pointer);
        return;
      }
      case kReallocarray: {
        size_t count = 1 + in_.byte() % 8;
        size_t size = in_.size() / count;
        if (live_.empty() || !roomFor(count * size)) return;
        size_t index = in_.below(live_.size());
        Block b = live_[index];
        checkBlock(b, "before reallocarray");
        void* p = api::reallocarrayImpl(b.pointer, count, size);
        afterRealloc(index, b, p, count * size, "reallocarray");
        return;
      }
      case kMemalign: {
        // Any alignment: glibc rounds one that is not a power of two up to the next.
        size_t alignment = in_.alignment() + (in_.byte() % 4 == 0 ? in_.byte() % 64 : 0);
        size_t size = in_.size();
        if (!roomFor(size + alignment)) return;
        size_t rounded = 1;
        while (rounded < alignment) rounded <<= 1;
        adopt(api::memalignImpl(alignment, size), size, rounded, "memalign");
        return;
      }
      case kPosixMemalign: {
        size_t alignment = in_.alignment() * sizeof(void*);
        size_t size = in_.size();
        void* out = reinterpret_cast<void*>(0x1);
        if (in_.byte() % 8 == 0) {  // not a power-of-two multiple of sizeof(void*)
          size_t bad = alignment + (1 + in_.byte() % 7);
          int error = api::posixMemalignImpl(&out, bad, size);
          FUZZ_REQUIRE(error == EINVAL && out == reinterpret_cast<void*>(0x1),
                       "posix_memalign(%zu, %zu) = %d, expected EINVAL and *memptr untouched", bad,
                       size, error);
          stats_.failedAsExpected++;
          return;
        }
        if (!roomFor(size + alignment)) return;
        int error = api::posixMemalignImpl(&out, alignment, size);
        FUZZ_REQUIRE(error == 0, "posix_memalign(%zu, %zu) = %d", alignment, size, error);
        adopt(out, size, alignment, "posix_memalign");
        return;
      }
      case kAlignedAlloc: {
        size_t alignment = in_.alignment();
        size_t size = in_.size();
        if (!roomFor(size + alignment)) return;
        adopt(api::alignedAllocImpl(alignment, size), size, alignment, "aligned_alloc");
        return;
      }
      case kValloc: {
        size_t size = in_.size();
        if (!roomFor(size + kPage)) return;
        adopt(api::vallocImpl(size), size, kPage, "valloc");
        return;
      }
      case kPvalloc: {
        size_t size = in_.size();
        if (!roomFor(size + kPage)) return;
        void* p = api::pvallocImpl(size);
        FUZZ_REQUIRE(p, "pvalloc(%zu) failed", size);
        size_t rounded = size ? (size + kPage - 1) & ~(kPage - 1) : kPage;
        size_t usable = heap::usableSize(p);
        FUZZ_REQUIRE(usable >= rounded, "pvalloc(%zu) = %p: usable %zu < %zu", size, p, usable,
                     rounded);
        adopt(p, size, kPage, "pvalloc");
        return;
      }
      case kUsableSize: {
        if (live_.empty()) return;
        Block& b = live_[in_.below(live_.size())];
        checkBlock(b, "before writing its slack");
        // The bytes past the request up to malloc_usable_size are the program's to use: write
        // them; the other blocks' checks catch a neighbour overwritten.
        size_t usable = heap::usableSize(b.pointer);
        size_t slack = usable - b.size;
        if (slack > kFullCheckBytes) slack = kFullCheckBytes;
        memset(static_cast<uint8_t*>(b.pointer) + b.size, 0xA5, slack);
        return;
      }
      case kRemoteFree: {
        if (live_.empty()) return;
        Block b = take(in_.below(live_.size()));
        checkBlock(b, "before handing it to the freeing thread");
        RemoteFreer::get().push(b);
        // TSan models the heap's remapping mmap calls (meshing, span reuse) as writes, so that the
        // other thread's reads of a block look racy while this one goes on: there the remote free
        // finishes before the next step.
        if (kThreadSanitizer) RemoteFreer::get().drain();
        stats_.remoteFrees++;
        return;
      }
      case kCompact: {
        if (compacts_ == kMaxCompactsPerProgram) return;
        compacts_++;
        stats_.compacts++;
        // Meshing moves blocks between spans while the other thread may be checking and freeing
        // them (not under TSan: see kRemoteFree).
        api::compactImpl();
        for (const Block& b : live_) checkBlock(b, "after meshalloc_compact");
        return;
      }
      case kFork:
        if (forks_ == kMaxForksPerProgram) return;
        forks_++;
        stats_.forks++;
        forkAndCheck();
        return;
      case kImpossible:
        impossible();
        return;
      case kBurst:
        burst();
        return;
      case kTrim:
        api::trimImpl(0);
        return;
      case kReallocChain: {
        if (live_.empty()) return;
        size_t index = in_.below(live_.size());
        for (unsigned steps = 1 + in_.byte() % 6; steps-- && index < live_.size();)
          reallocate(index, in_.size());
        return;
      }
      case kOpCount:
        break;
    }
    // Unreachable: the op is taken modulo kOpCount.
  }

  bool roomFor(size_t bytes) const {
    return live_.size() < kMaxLiveBlocks && liveBytes_ + bytes <= kMaxLiveBytes;
  }

  void adopt(void* p, size_t size, size_t alignment, const char* what) {
    FUZZ_REQUIRE(p, "%s(%zu) with alignment %zu failed", what, size, alignment);
    FUZZ_REQUIRE(reinterpret_cast<uintptr_t>(p) % alignment == 0,
                 "%s(%zu) = %p is not aligned to %zu", what, size, p, alignment);
    size_t usable = heap::usableSize(p);
    FUZZ_REQUIRE(usable >= size, "%s(%zu) = %p: malloc_usable_size %zu", what, size, p, usable);
    Block b{p, size, nextId_++, alignment};
    fill(p, size, seedOf(b.id, size));
    live_.push_back(b);
    liveBytes_ += size;
  }

  Block take(size_t index) {
    Block b = live_[index];
    live_[index] = live_.back();
    live_.pop_back();
    liveBytes_ -= b.size;
    return b;
  }

  void reallocate(size_t index, size_t size) {
    Block b = live_[index];
    if (size > b.size && !roomFor(size - b.size)) return;
    checkBlock(b, "before realloc");
    void* p = api::reallocImpl(b.pointer, size);
    afterRealloc(index, b, p, size, "realloc");
  }

  // `p` is what realloc-like `what` returned for block `old` (at `index`) resized to `size`.
  void afterRealloc(size_t index, const Block& old, void* p, size_t size, const char* what) {
    if (size == 0) {  // glibc frees the block and returns NULL
      FUZZ_REQUIRE(!p, "%s(%p, 0) = %p, expected NULL", what, old.pointer, p);
      take(index);
      return;
    }
    FUZZ_REQUIRE(p, "%s(%p, %zu) failed", what, old.pointer, size);
    size_t wrong = firstWrongByte(p, old.size, seedOf(old.id, old.size), size);
    FUZZ_REQUIRE(wrong == SIZE_MAX, "%s(%p, %zu -> %zu) = %p lost byte %zu", what, old.pointer,
                 old.size, size, p, wrong);
    take(index);
    adopt(p, size, 1, what);
  }

  // Requests that cannot be met: NULL with ENOMEM (or EINVAL for a bad alignment), and a block
  // passed in stays as it was.
  void impossible() {
    size_t huge = in_.byte() % 2 ? SIZE_MAX - in_.byte() * kPage
                                 : static_cast<size_t>(PTRDIFF_MAX) + 1 + in_.u16();
    Block* b = live_.empty() ? nullptr : &live_[in_.below(live_.size())];
    errno = 0;
    void* p = nullptr;
    int expected = ENOMEM;
    const char* what = "";
    switch (in_.byte() % 10) {
      case 0:
        what = "malloc";
        p = api::mallocImpl(huge);
        break;
      case 1:
        what = "calloc";
        p = api::callocImpl(huge / 2 + 1, 2 + in_.byte());
        break;
      case 2:
        what = "calloc";
        p = api::callocImpl(1, huge);
        break;
      case 3:
        what = "memalign";
        p = api::memalignImpl(in_.alignment(), huge);
        break;
      case 4:
        what = "aligned_alloc";
        p = api::alignedAllocImpl(in_.alignment(), huge);
        break;
      case 5:
        what = "valloc";
        p = api::vallocImpl(huge);
        break;
      case 6:
        what = "pvalloc";
        p = api::pvallocImpl(huge);
        break;
      case 7: {
        what = "posix_memalign";
        void* out = reinterpret_cast<void*>(0x1);
        int error = api::posixMemalignImpl(&out, in_.alignment() * sizeof(void*), huge);
        FUZZ_REQUIRE(error == ENOMEM && out == reinterpret_cast<void*>(0x1),
                     "posix_memalign(huge %zu) = %d, expected ENOMEM and *memptr untouched", huge,
                     error);
        stats_.failedAsExpected++;
        return;
      }
      case 8:
        what = "memalign with an alignment above SIZE_MAX/2+1";
        expected = EINVAL;
        {
          size_t alignment = SIZE_MAX / 2 + 2 + in_.byte();
          p = api::memalignImpl(alignment, 1 + in_.byte());
          break;
        }
      default:
        if (!b) return;
        if (in_.byte() % 2) {
          what = "realloc";
          p = api::reallocImpl(b->pointer, huge);
        } else {
          what = "reallocarray";
          p = api::reallocarrayImpl(b->pointer, huge / 3 + 1, 4);
        }
        break;
    }
    int error = errno;
    FUZZ_REQUIRE(!p && error == expected, "%s (huge %zu) = %p with errno %d, expected NULL and %d",
                 what, huge, p, error, expected);
    if (b) checkBlock(*b, "after a failed request");
    stats_.failedAsExpected++;
  }

  // Many blocks of one small size, then most of them freed: sparse, partly empty spans, the
  // material meshing works on (spans whose live slots do not overlap).
  void burst() {
    size_t size = 1 + in_.below(in_.byte() % 2 ? 256 : 4096);
    size_t count = 16 + in_.below(496);
    size_t first = live_.size();
    for (size_t i = 0; i < count && roomFor(size); i++)
      adopt(api::mallocImpl(size), size, 1, "malloc (burst)");
    size_t end = live_.size();
    std::vector<size_t> doomed;
    if (in_.byte() % 2) {
      // The input picks the survivors, one bit each.
      for (size_t i = first; i < end; i += 8) {
        uint8_t bits = in_.byte();
        for (size_t j = 0; j < 8 && i + j < end; j++)
          if (bits >> j & 1) doomed.push_back(i + j);
      }
    } else {
      // One survivor in `stride`.
      size_t stride = 2 + in_.byte() % 15, offset = in_.byte() % stride;
      for (size_t i = first; i < end; i++)
        if ((i - first) % stride != offset) doomed.push_back(i);
    }
    for (size_t k = doomed.size(); k-- > 0;) {  // from the back: take() swaps with the last
      Block b = take(doomed[k]);
      checkBlock(b, "before free (burst)");
      api::freeImpl(b.pointer);
    }
  }

  // A child checks a few blocks, overwrites them, allocates and frees, then exits; the parent's
  // blocks must keep their contents.
  void forkAndCheck() {
    RemoteFreer::get().drain();  // no thread of ours inside the heap (or libc's malloc) now
    size_t picks[8];
    size_t npicks = live_.empty() ? 0 : 1 + in_.byte() % 8;
    for (size_t i = 0; i < npicks; i++) picks[i] = in_.below(live_.size());
    size_t childSize = in_.size();
    fflush(stderr);
    pid_t pid = fork();
    FUZZ_REQUIRE(pid >= 0, "fork failed: %s", strerror(errno));
    if (pid == 0) {
      int status = 0;
      for (size_t i = 0; i < npicks; i++) {
        const Block& b = live_[picks[i]];
        if (firstWrongByte(b.pointer, b.size, seedOf(b.id, b.size), b.size) != SIZE_MAX) status = 1;
      }
      for (size_t i = 0; i < npicks; i++) {
        const Block& b = live_[picks[i]];
        fill(b.pointer, b.size, seedOf(b.id + (uint64_t{1} << 40), b.size));
      }
      void* p = api::mallocImpl(childSize);
      if (!p) {
        status = 2;
      } else {
        fill(p, childSize, seedOf(~uint64_t{0}, childSize));
        if (firstWrongByte(p, childSize, seedOf(~uint64_t{0}, childSize), childSize) != SIZE_MAX)
          status = 3;
        api::freeImpl(p);
      }
      if (npicks) api::freeImpl(live_[picks[0]].pointer);
      _exit(status);
    }
    int status = 0;
    pid_t waited;
    do {
      waited = waitpid(pid, &status, 0);
    } while (waited < 0 && errno == EINTR);
    FUZZ_REQUIRE(waited == pid, "waitpid: %s", strerror(errno));
    FUZZ_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                 "forked child failed (status 0x%x: 1 = a block changed, 2 = malloc failed, "
                 "3 = its own block changed)",
                 status);
    for (const Block& b : live_) checkBlock(b, "after fork (the child wrote its own values)");
  }

  Input& in_;
  std::vector<Block> live_;
  size_t liveBytes_ = 0;
  uint64_t nextId_ = 0;
  unsigned compacts_ = 0;
  unsigned forks_ = 0;
  ProgramStats stats_;
};

bool initialize() {
  if (!heap::ensureInitialized()) fail("the heap could not be initialised");
  // Meshing on, and run inline by meshalloc_compact rather than by a background thread, so that
  // a program does the same every time it is replayed.
  gHeapConfig.meshing = true;
  gHeapConfig.meshBackgroundThread = false;
  MeshPolicy::init();
  return true;
}

}  // namespace

ProgramStats runHeapProgram(const uint8_t* data, size_t size) {
  static bool initialized = initialize();
  (void)initialized;
  Input in(data, size);
  Program program(in);
  program.run();
  const ProgramStats& s = program.stats();
  gTotals.operations += s.operations;
  gTotals.remoteFrees += s.remoteFrees;
  gTotals.compacts += s.compacts;
  gTotals.forks += s.forks;
  gTotals.failedAsExpected += s.failedAsExpected;
  return s;
}

const ProgramStats& totals() {
  return gTotals;
}

uint64_t meshedSpans() {
  return Mesher::stats().meshedSpans;
}

}  // namespace meshalloc::fuzz

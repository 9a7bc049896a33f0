// The C allocation entry points, each edge case compared with glibc's own implementation at
// run time (glibc 2.36 is the reference: where it differs from a man page, glibc wins).
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

using meshtest::allocatedBytes;
using meshtest::GlibcReference;
using meshtest::isAligned;
using meshtest::launder;

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Sizes that no allocator can satisfy on a 64-bit machine with a 47/57-bit address space.
const size_t kImpossibleSizes[] = {
    SIZE_MAX,
    SIZE_MAX - 1,
    SIZE_MAX - 16,
    SIZE_MAX - 4096,
    SIZE_MAX / 2,
    SIZE_MAX / 2 + 1,
    static_cast<size_t>(PTRDIFF_MAX),
    static_cast<size_t>(PTRDIFF_MAX) + 1,
    static_cast<size_t>(PTRDIFF_MAX) - 4096,
    static_cast<size_t>(PTRDIFF_MAX) - 65536,
};

// Small sizes every size class boundary is near, plus pages and large objects.
std::vector<size_t> representativeSizes() {
  std::vector<size_t> sizes;
  for (size_t n = 1; n <= 256; ++n) sizes.push_back(n);
  for (size_t n = 257; n <= 20000; n += 61) sizes.push_back(n);
  for (size_t shift = 5; shift <= 14; ++shift) {
    size_t p = size_t{1} << shift;
    sizes.insert(sizes.end(), {p - 1, p, p + 1});
  }
  sizes.insert(sizes.end(), {kPage - 1, kPage, kPage + 1, 65536, 65537, 100000, 262144 + 17,
                             (size_t{1} << 20) + 3, size_t{4} << 20});
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// The strongest alignment C requires for an object of `size` bytes.
size_t requiredAlignment(size_t size) {
  if (size == 0) return 1;
  return std::min(alignof(max_align_t), std::bit_floor(size));
}

TEST(Malloc, ZeroBytesGivesUniqueNonNullPointers) {
  void* glibc = __libc_malloc(0);
  ASSERT_NE(glibc, nullptr) << "reference: glibc's malloc(0) is non-NULL";
  __libc_free(glibc);

  std::vector<void*> ptrs;
  std::set<void*> distinct;
  for (int i = 0; i < 1000; ++i) {
    void* p = malloc(0);
    ASSERT_NE(p, nullptr) << "malloc(0) #" << i;
    ptrs.push_back(p);
    distinct.insert(p);
  }
  EXPECT_EQ(distinct.size(), ptrs.size()) << "malloc(0) returned the same pointer twice";
  for (void* p : ptrs) free(p);
}

TEST(Malloc, AlignedWritableAndDistinctForEverySize) {
  for (size_t n : representativeSizes()) {
    void* p[4];
    for (auto& q : p) {
      q = malloc(n);
      ASSERT_NE(q, nullptr) << n;
      EXPECT_TRUE(isAligned(q, requiredAlignment(n))) << q << " for malloc(" << n << ")";
      meshtest::fillPattern(q, n, 1);
    }
    for (auto& q : p) {
      ASSERT_EQ(meshtest::firstMismatch(q, q, n, 1, n), SIZE_MAX) << "size " << n;
      free(q);
    }
  }
}

TEST(Malloc, ImpossibleSizesFailWithEnomem) {
  for (size_t n : kImpossibleSizes) {
    errno = 0;
    void* ref = __libc_malloc(n);
    int refErrno = errno;
    ASSERT_EQ(ref, nullptr) << "reference: glibc malloc(" << n << ")";
    ASSERT_EQ(refErrno, ENOMEM);

    errno = 0;
    void* p = malloc(n);
    int err = errno;
    EXPECT_EQ(p, nullptr) << "malloc(" << n << ")";
    EXPECT_EQ(err, ENOMEM) << "malloc(" << n << ") errno";
    if (p) free(p);
  }
}

TEST(Free, NullIsANoOp) {
  // glibc's free(NULL) leaves errno alone (and so must ours: a program may free on an error
  // path before reading errno), and changes nothing in the heap.
  errno = 1234;
  __libc_free(launder(static_cast<void*>(nullptr)));
  ASSERT_EQ(errno, 1234) << "reference: glibc free(NULL)";
  size_t allocatedBefore = mallinfo2().uordblks;
  errno = 1234;
  free(nullptr);
  free(launder(static_cast<void*>(nullptr)));
  int err = errno;
  size_t allocatedAfter = mallinfo2().uordblks;
  EXPECT_EQ(err, 1234) << "free(NULL) changed errno";
  EXPECT_EQ(allocatedAfter, allocatedBefore);
}

TEST(Calloc, ZeroesFreshMemory) {
  for (size_t n : representativeSizes()) {
    auto* p = static_cast<unsigned char*>(calloc(1, n));
    ASSERT_NE(p, nullptr) << n;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0) << "calloc(1, " << n << ") byte " << i;
    free(p);
  }
}

// Reused memory must be zeroed too: dirty a batch of objects, free them, calloc again.
TEST(Calloc, ZeroesReusedMemory) {
  for (size_t n : representativeSizes()) {
    const int count = n > 65536 ? 4 : 64;
    std::vector<void*> ptrs;
    for (int i = 0; i < count; ++i) {
      void* p = malloc(n);
      ASSERT_NE(p, nullptr);
      memset(p, 0xA5, malloc_usable_size(p));
      ptrs.push_back(p);
    }
    for (void* p : ptrs) free(p);
    ptrs.clear();
    for (int i = 0; i < count; ++i) {
      auto* p = static_cast<unsigned char*>(calloc(n, 1));
      ASSERT_NE(p, nullptr);
      for (size_t b = 0; b < n; ++b) {
        ASSERT_EQ(p[b], 0) << "calloc(" << n << ", 1) #" << i << " byte " << b << " not zero";
      }
      memset(p, 0x5A, n);
      ptrs.push_back(p);
    }
    for (void* p : ptrs) free(p);
  }
}

TEST(Calloc, ZeroCountOrSizeBehavesLikeGlibc) {
  const size_t cases[][2] = {{0, 0}, {0, 8}, {8, 0}, {0, SIZE_MAX}, {SIZE_MAX, 0}};
  for (const auto& c : cases) {
    void* ref = __libc_calloc(c[0], c[1]);
    void* p = calloc(c[0], c[1]);
    EXPECT_EQ(p != nullptr, ref != nullptr) << "calloc(" << c[0] << ", " << c[1] << ")";
    __libc_free(ref);
    free(p);
  }
}

TEST(Calloc, OverflowFailsWithEnomem) {
  const size_t cases[][2] = {
      {SIZE_MAX, 2},
      {2, SIZE_MAX},
      {SIZE_MAX / 2 + 1, 2},
      {size_t{1} << 32, size_t{1} << 32},
      {(size_t{1} << 33) + 1, size_t{1} << 31},
      {SIZE_MAX / 3 + 1, 3},
      {1, SIZE_MAX},
      {static_cast<size_t>(PTRDIFF_MAX), 1},
      {static_cast<size_t>(PTRDIFF_MAX) / 8 + 1, 8},
  };
  for (const auto& c : cases) {
    errno = 0;
    void* ref = __libc_calloc(c[0], c[1]);
    int refErrno = errno;
    ASSERT_EQ(ref, nullptr) << "reference: glibc calloc(" << c[0] << ", " << c[1] << ")";
    ASSERT_EQ(refErrno, ENOMEM);

    errno = 0;
    void* p = calloc(c[0], c[1]);
    int err = errno;
    EXPECT_EQ(p, nullptr) << "calloc(" << c[0] << ", " << c[1] << ")";
    EXPECT_EQ(err, ENOMEM) << "calloc(" << c[0] << ", " << c[1] << ") errno";
    if (p) free(p);
  }
}

TEST(Realloc, NullPointerActsLikeMalloc) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{16384}, size_t{1} << 20}) {
    void* ref = __libc_realloc(nullptr, n);
    ASSERT_NE(ref, nullptr) << "reference: glibc realloc(NULL, " << n << ")";
    __libc_free(ref);

    void* p = realloc(nullptr, n);
    ASSERT_NE(p, nullptr) << "realloc(NULL, " << n << ")";
    EXPECT_GE(malloc_usable_size(p), n);
    memset(p, 0x11, n);
    free(p);
  }
}

// glibc 2.36 (REALLOC_ZERO_BYTES_FREES): realloc(p, 0) frees p and returns NULL.
TEST(Realloc, ZeroSizeFreesAndReturnsNull) {
  void* ref = __libc_malloc(100);
  ASSERT_NE(ref, nullptr);
  void* refResult = __libc_realloc(ref, 0);
  ASSERT_EQ(refResult, nullptr) << "reference: glibc realloc(p, 0)";

  for (size_t n : {size_t{1}, size_t{64}, size_t{5000}, size_t{1} << 20}) {
    void* p = malloc(n);
    ASSERT_NE(p, nullptr);
    void* q = realloc(p, 0);
    EXPECT_EQ(q, nullptr) << "realloc(malloc(" << n << "), 0)";
    if (q) free(q);
  }
}

// The object passed to realloc(p, 0) really is released: repeating it must not accumulate
// live bytes.
TEST(Realloc, ZeroSizeReleasesTheObject) {
  const size_t before = allocatedBytes();
  for (int i = 0; i < 20000; ++i) {
    void* p = malloc(1000);
    ASSERT_NE(p, nullptr);
    memset(p, 1, 1000);
    void* q = realloc(p, 0);
    if (q) free(q);
  }
  const size_t after = allocatedBytes();
  // 20000 leaked objects would be 20 MB; allow slack for caches and the test's own use.
  EXPECT_LT(after, before + (size_t{4} << 20)) << "before " << before << " after " << after;
}

TEST(Realloc, PreservesContentsAcrossClassesAndLargeObjects) {
  const size_t steps[] = {1,     8,          24,       100,      1000,   5000,  16384,
                          16385, 70000,      1u << 20, 3u << 20, 100,    40000, 7,
                          0x200, (5u << 20), 12345,    1,        2 << 20};
  size_t size = 1;
  auto* p = static_cast<unsigned char*>(malloc(size));
  ASSERT_NE(p, nullptr);
  meshtest::fillPattern(p, size, 7);
  for (size_t next : steps) {
    void* oldBase = p;
    auto* q = static_cast<unsigned char*>(realloc(p, next));
    ASSERT_NE(q, nullptr) << "realloc to " << next;
    size_t kept = std::min(size, next);
    size_t bad = meshtest::firstMismatch(q, oldBase, size, 7, kept);
    ASSERT_EQ(bad, SIZE_MAX) << "realloc " << size << " -> " << next << " lost byte " << bad;
    EXPECT_GE(malloc_usable_size(q), next);
    EXPECT_TRUE(isAligned(q, requiredAlignment(next)));
    p = q;
    size = next;
    meshtest::fillPattern(p, size, 7);
  }
  free(p);
}

// On failure realloc returns NULL with ENOMEM and leaves the original block untouched.
TEST(Realloc, FailureKeepsTheOriginal) {
  for (size_t start : {size_t{48}, size_t{10000}, size_t{1} << 20}) {
    auto* p = static_cast<unsigned char*>(malloc(start));
    ASSERT_NE(p, nullptr);
    meshtest::fillPattern(p, start, 3);
    for (size_t n : kImpossibleSizes) {
      errno = 0;
      void* q = realloc(p, n);
      int err = errno;
      EXPECT_EQ(q, nullptr) << "realloc(" << start << "-byte object, " << n << ")";
      EXPECT_EQ(err, ENOMEM);
      if (q) {
        p = static_cast<unsigned char*>(q);
        break;
      }
      ASSERT_EQ(meshtest::firstMismatch(p, p, start, 3, start), SIZE_MAX)
          << "failed realloc damaged the original";
    }
    free(p);
  }
}

TEST(Reallocarray, OverflowFailsWithEnomemAndKeepsTheOriginal) {
  const size_t cases[][2] = {
      {SIZE_MAX, 2}, {2, SIZE_MAX}, {size_t{1} << 32, size_t{1} << 32}, {SIZE_MAX / 3 + 1, 3}};
  auto* ref = static_cast<char*>(__libc_malloc(64));
  auto* p = static_cast<unsigned char*>(malloc(64));
  ASSERT_NE(p, nullptr);
  meshtest::fillPattern(p, 64, 9);
  for (const auto& c : cases) {
    errno = 0;
    void* r = GlibcReference::get().reallocarray(ref, c[0], c[1]);
    int refErrno = errno;
    ASSERT_EQ(r, nullptr);
    ASSERT_EQ(refErrno, ENOMEM);

    errno = 0;
    void* q = reallocarray(p, c[0], c[1]);
    int err = errno;
    EXPECT_EQ(q, nullptr) << "reallocarray(p, " << c[0] << ", " << c[1] << ")";
    EXPECT_EQ(err, ENOMEM);
    if (q) {
      p = static_cast<unsigned char*>(q);
      break;
    }
    ASSERT_EQ(meshtest::firstMismatch(p, p, 64, 9, 64), SIZE_MAX);

    errno = 0;
    q = reallocarray(nullptr, c[0], c[1]);
    err = errno;
    EXPECT_EQ(q, nullptr) << "reallocarray(NULL, " << c[0] << ", " << c[1] << ")";
    EXPECT_EQ(err, ENOMEM);
    free(q);
  }
  __libc_free(ref);
  free(p);
}

TEST(Reallocarray, GrowsLikeRealloc) {
  auto* p = static_cast<uint32_t*>(reallocarray(nullptr, 10, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  for (uint32_t i = 0; i < 10; ++i) p[i] = i * 7;
  p = static_cast<uint32_t*>(reallocarray(p, 100000, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_EQ(p[i], i * 7);
  p[99999] = 1;
  free(p);
}

// --- aligned allocation ----------------------------------------------------------------------

std::vector<size_t> powerOfTwoAlignments() {
  std::vector<size_t> a;
  for (size_t x = 1; x <= (size_t{1} << 20); x <<= 1) a.push_back(x);
  return a;
}

std::vector<size_t> sizesFor(size_t alignment) {
  return {0, 1, 8, alignment - 1, alignment, alignment + 1, 3 * alignment, 100000};
}

void checkAligned(void* p, size_t alignment, size_t size, const char* what) {
  ASSERT_NE(p, nullptr) << what << "(" << alignment << ", " << size << ")";
  EXPECT_TRUE(isAligned(p, alignment)) << what << "(" << alignment << ", " << size << ") = " << p;
  EXPECT_GE(malloc_usable_size(p), size);
  memset(p, 0x3C, size);
}

TEST(AlignedAllocation, PowerOfTwoAlignmentsUpToOneMiB) {
  for (size_t a : powerOfTwoAlignments()) {
    for (size_t n : sizesFor(a)) {
      void* m = memalign(a, n);
      checkAligned(m, a, n, "memalign");
      void* aa = aligned_alloc(a, n);
      checkAligned(aa, a, n, "aligned_alloc");
      if (a >= sizeof(void*)) {
        void* pm = reinterpret_cast<void*>(0x1);
        ASSERT_EQ(posix_memalign(&pm, a, n), 0) << "posix_memalign(" << a << ", " << n << ")";
        checkAligned(pm, a, n, "posix_memalign");
        free(pm);
      }
      free(m);
      free(aa);
    }
  }
}

// Many live aligned objects at once must not overlap.
TEST(AlignedAllocation, ManyLiveObjectsDoNotOverlap) {
  for (size_t a : {size_t{32}, size_t{64}, size_t{256}, size_t{4096}, size_t{65536}}) {
    std::vector<std::pair<void*, size_t>> live;
    for (int i = 0; i < 64; ++i) {
      size_t n = 1 + (static_cast<size_t>(i) * 97) % (2 * a);
      void* p = aligned_alloc(a, n);
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(isAligned(p, a));
      meshtest::fillPattern(p, n, a);
      live.emplace_back(p, n);
    }
    for (auto& [p, n] : live) {
      ASSERT_EQ(meshtest::firstMismatch(p, p, n, a, n), SIZE_MAX) << "alignment " << a;
      free(p);
    }
  }
}

// Alignments that are not powers of two, or powers of two below sizeof(void*), are compared
// with what glibc 2.36 itself does: memalign and aligned_alloc round the alignment up to a power
// of two (and fail with EINVAL only above SIZE_MAX/2+1); posix_memalign returns EINVAL.
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kHalf = SIZE_MAX / 2;  // SIZE_MAX / 2 + 1 is the largest power of two
const std::vector<size_t>& oddAlignments() {
  static const std::vector<size_t> alignments = [] {
    std::vector<size_t> a = {0, 1, 2, 3, 4, 5, 6, 7, 12, 24, 48, 100, 1000, 4095, 4097, 65535};
    const size_t big[] = {65537, kMiB + 1, 3 * kMiB, kHalf, kHalf + 1, kHalf + 2, SIZE_MAX};
    a.insert(a.end(), std::begin(big), std::end(big));
    return a;
  }();
  return alignments;
}

// The alignment glibc guarantees for `alignment` (it rounds up to a power of two).
size_t guaranteedAlignment(size_t alignment) {
  if (alignment <= 1) return 1;
  return std::bit_ceil(alignment);
}

template <typename Mine, typename Theirs, typename TheirFree>
void compareOddAlignments(const char* what, Mine mine, Theirs theirs, TheirFree theirFree) {
  for (size_t a : oddAlignments()) {
    for (size_t n : {size_t{1}, size_t{100}, size_t{5000}}) {
      errno = 0;
      void* ref = theirs(a, n);
      int refErrno = errno;
      errno = 0;
      void* p = mine(a, n);
      int err = errno;
      if (ref == nullptr) {
        EXPECT_EQ(p, nullptr) << what << "(" << a << ", " << n << "): glibc fails (errno "
                              << refErrno << ") but meshalloc returned " << p;
        EXPECT_EQ(err, refErrno) << what << "(" << a << ", " << n << ") errno";
      } else {
        size_t g = guaranteedAlignment(a);
        ASSERT_TRUE(isAligned(ref, g)) << "reference: glibc " << what << "(" << a << ")";
        EXPECT_NE(p, nullptr) << what << "(" << a << ", " << n << "): glibc succeeds";
        if (p) {
          EXPECT_TRUE(isAligned(p, g))
              << what << "(" << a << ", " << n << ") = " << p << ", glibc aligns to " << g;
          EXPECT_GE(malloc_usable_size(p), n);
          memset(p, 0x77, n);
        }
      }
      theirFree(ref);
      free(p);
    }
  }
}

TEST(AlignedAllocation, MemalignOddAlignmentsMatchGlibc) {
  compareOddAlignments(
      "memalign", [](size_t a, size_t n) { return memalign(a, n); },
      [](size_t a, size_t n) { return __libc_memalign(a, n); }, [](void* p) { __libc_free(p); });
}

TEST(AlignedAllocation, AlignedAllocOddAlignmentsMatchGlibc) {
  compareOddAlignments(
      "aligned_alloc", [](size_t a, size_t n) { return aligned_alloc(a, n); },
      [](size_t a, size_t n) { return GlibcReference::get().aligned_alloc(a, n); },
      [](void* p) { __libc_free(p); });
}

TEST(AlignedAllocation, PosixMemalignRejectsBadAlignmentsWithoutTouchingResult) {
  for (size_t a : oddAlignments()) {
    void* ref = reinterpret_cast<void*>(0xdead0);
    int refRc = GlibcReference::get().posix_memalign(&ref, a, 64);
    void* p = reinterpret_cast<void*>(0xdead0);
    int rc = posix_memalign(&p, a, 64);
    EXPECT_EQ(rc, refRc) << "posix_memalign(&p, " << a << ", 64)";
    if (refRc != 0) {
      EXPECT_EQ(p, reinterpret_cast<void*>(0xdead0))
          << "posix_memalign(&p, " << a << ", 64) failed but wrote *memptr";
    } else {
      __libc_free(ref);
      if (rc == 0) {
        EXPECT_TRUE(isAligned(p, a));
        free(p);
      }
    }
  }
  // The cases the brief names explicitly.
  for (size_t a : {size_t{0}, size_t{3}, size_t{4}, size_t{24}, size_t{4097}}) {
    void* p = reinterpret_cast<void*>(0xbeef0);
    EXPECT_EQ(posix_memalign(&p, a, 16), EINVAL) << "alignment " << a;
    EXPECT_EQ(p, reinterpret_cast<void*>(0xbeef0));
  }
}

TEST(AlignedAllocation, ImpossibleSizesFailWithEnomem) {
  for (size_t n : kImpossibleSizes) {
    for (size_t a : {size_t{16}, size_t{64}, size_t{4096}, size_t{1} << 20}) {
      errno = 0;
      void* ref = __libc_memalign(a, n);
      int refErrno = errno;
      ASSERT_EQ(ref, nullptr);
      ASSERT_EQ(refErrno, ENOMEM) << "reference: glibc memalign(" << a << ", " << n << ")";

      errno = 0;
      void* p = memalign(a, n);
      int err = errno;
      EXPECT_EQ(p, nullptr) << "memalign(" << a << ", " << n << ")";
      EXPECT_EQ(err, ENOMEM) << "memalign(" << a << ", " << n << ") errno";
      free(p);

      errno = 0;
      p = aligned_alloc(a, n);
      err = errno;
      EXPECT_EQ(p, nullptr) << "aligned_alloc(" << a << ", " << n << ")";
      EXPECT_EQ(err, ENOMEM) << "aligned_alloc(" << a << ", " << n << ") errno";
      free(p);

      void* pm = reinterpret_cast<void*>(0xfeed0);
      void* refPm = reinterpret_cast<void*>(0xfeed0);
      int refRc = GlibcReference::get().posix_memalign(&refPm, a, n);
      ASSERT_EQ(refRc, ENOMEM);
      EXPECT_EQ(posix_memalign(&pm, a, n), ENOMEM) << "posix_memalign(" << a << ", " << n << ")";
      EXPECT_EQ(pm, reinterpret_cast<void*>(0xfeed0));
    }
  }
}

TEST(PageAllocation, VallocIsPageAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, kPage - 1, kPage, kPage + 1, 3 * kPage,
                   size_t{1} << 20}) {
    void* ref = __libc_valloc(n);
    void* p = valloc(n);
    ASSERT_EQ(p != nullptr, ref != nullptr) << "valloc(" << n << ")";
    __libc_free(ref);
    if (!p) continue;
    EXPECT_TRUE(isAligned(p, kPage)) << "valloc(" << n << ") = " << p;
    EXPECT_GE(malloc_usable_size(p), n);
    memset(p, 0x42, n);
    free(p);
  }
}

TEST(PageAllocation, PvallocRoundsUpToWholePages) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, kPage - 1, kPage, kPage + 1, 3 * kPage + 5,
                   size_t{1} << 20}) {
    void* ref = __libc_pvalloc(n);
    void* p = pvalloc(n);
    ASSERT_EQ(p != nullptr, ref != nullptr) << "pvalloc(" << n << ")";
    __libc_free(ref);
    if (!p) continue;
    const size_t rounded = (n + kPage - 1) / kPage * kPage;
    EXPECT_TRUE(isAligned(p, kPage)) << "pvalloc(" << n << ") = " << p;
    EXPECT_GE(malloc_usable_size(p), rounded) << "pvalloc(" << n << ") must hold whole pages";
    memset(p, 0x24, rounded);
    free(p);
  }
}

TEST(PageAllocation, ImpossibleSizesFailWithEnomem) {
  for (size_t n : kImpossibleSizes) {
    errno = 0;
    void* ref = __libc_valloc(n);
    int refErrno = errno;
    ASSERT_EQ(ref, nullptr);
    ASSERT_EQ(refErrno, ENOMEM);
    errno = 0;
    ref = __libc_pvalloc(n);
    refErrno = errno;
    ASSERT_EQ(ref, nullptr);
    ASSERT_EQ(refErrno, ENOMEM);

    errno = 0;
    void* p = valloc(n);
    int err = errno;
    EXPECT_EQ(p, nullptr) << "valloc(" << n << ")";
    EXPECT_EQ(err, ENOMEM) << "valloc(" << n << ") errno";
    free(p);
    errno = 0;
    p = pvalloc(n);
    err = errno;
    EXPECT_EQ(p, nullptr) << "pvalloc(" << n << ")";
    EXPECT_EQ(err, ENOMEM) << "pvalloc(" << n << ") errno";
    free(p);
  }
}

}  // namespace

// glibc semantics of the entry points, in-process (the exported symbols are tested against
// glibc itself in tests/api).
#include "api/entry_points.h"
#include "api/libc_buffers.h"

#include <dlfcn.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <stdint.h>
#include <unistd.h>

#include <cstring>

#include "heap/heap.h"

namespace meshalloc::api {
namespace {

TEST(EntryPoints, MallocZeroIsUniqueAndFreeNullIsANoOp) {
  void* a = mallocImpl(0);
  void* b = mallocImpl(0);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a, b);
  freeImpl(a);
  freeImpl(b);
  freeImpl(nullptr);
}

TEST(EntryPoints, ImpossibleSizesFailWithEnomem) {
  for (size_t size : {SIZE_MAX, SIZE_MAX - 4096, static_cast<size_t>(PTRDIFF_MAX) + 1}) {
    errno = 0;
    EXPECT_EQ(mallocImpl(size), nullptr);
    EXPECT_EQ(errno, ENOMEM);
  }
  errno = 0;
  EXPECT_EQ(callocImpl(SIZE_MAX / 2, 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  void* p = mallocImpl(16);
  errno = 0;
  EXPECT_EQ(reallocarrayImpl(p, SIZE_MAX / 2, 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(reallocImpl(p, SIZE_MAX), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  freeImpl(p);  // a failed realloc leaves the block alone
}

TEST(EntryPoints, ReallocEdgeCases) {
  void* p = reallocImpl(nullptr, 100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reallocImpl(p, 0), nullptr) << "glibc frees and returns NULL";
}

TEST(EntryPoints, CallocZeroesReusedMemory) {
  for (size_t size : {24ul, 1000ul, 16384ul, 100000ul}) {
    void* dirty = mallocImpl(size);
    memset(dirty, 0xff, size);
    freeImpl(dirty);
    unsigned char* p = static_cast<unsigned char*>(callocImpl(1, size));
    for (size_t i = 0; i < size; i++) ASSERT_EQ(p[i], 0) << size << " at " << i;
    freeImpl(p);
  }
}

TEST(EntryPoints, AlignmentRules) {
  void* out = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(posixMemalignImpl(&out, 3, 10), EINVAL);
  EXPECT_EQ(posixMemalignImpl(&out, sizeof(void*) * 3, 10), EINVAL);
  EXPECT_EQ(posixMemalignImpl(&out, 0, 10), EINVAL);
  EXPECT_EQ(out, reinterpret_cast<void*>(0x1)) << "failure must not touch *memptr";
  for (size_t alignment = sizeof(void*); alignment <= (size_t{1} << 22); alignment *= 2) {
    for (size_t size : {0ul, 1ul, 100ul, 5000ul, 70000ul}) {
      ASSERT_EQ(posixMemalignImpl(&out, alignment, size), 0);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(out) % alignment, 0u) << alignment << "/" << size;
      EXPECT_GE(heap::usableSize(out), size);
      memset(out, 1, size);
      freeImpl(out);
    }
  }
  void* rounded = memalignImpl(48, 10);  // glibc rounds a non-power-of-two up (to 64)
  ASSERT_NE(rounded, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(rounded) % 64, 0u);
  freeImpl(rounded);
  errno = 0;
  EXPECT_EQ(memalignImpl(SIZE_MAX, 10), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(EntryPoints, PageAlignedVariants) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* v = vallocImpl(10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v) % page, 0u);
  void* pv = pvallocImpl(page + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pv) % page, 0u);
  EXPECT_GE(heap::usableSize(pv), 2 * page);
  errno = 0;
  EXPECT_EQ(pvallocImpl(SIZE_MAX), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  freeImpl(v);
  freeImpl(pv);
}

TEST(EntryPoints, IntrospectionIsPlausible) {
  struct mallinfo2 before = mallinfo2Impl();
  void* p = mallocImpl(1 << 20);
  struct mallinfo2 after = mallinfo2Impl();
  EXPECT_GE(after.uordblks, before.uordblks + (1 << 20));
  EXPECT_GE(after.hblkhd, size_t{1} << 20);
  freeImpl(p);
  // The freed object's pages sit in the dirty cache: trimming gives them back (1), and a second
  // trim finds nothing left (0).
  int released = trimImpl(0);
  int again = trimImpl(0);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(again, 0);
  EXPECT_EQ(malloptImpl(M_ARENA_MAX, 2), 1);
  EXPECT_EQ(malloptImpl(M_MXFAST, 100000), 0);
  EXPECT_EQ(infoImpl(1, stdout), EINVAL);
}

// malloc pins the blocks glibc allocates for the kernel to fill (stdio's buffers), telling them
// by their caller's address: inside _IO_file_doallocate or getcwd, and nowhere else (not in
// glibc's other functions: their blocks keep their spans meshable).
void notInLibc() {}

TEST(EntryPoints, LibcBufferAllocationsAreToldByCaller) {
  ASSERT_GE(findLibcBufferCallers(), 1u) << "glibc's _IO_file_doallocate was not found";
  // glibc's own functions, not the sanitizers' interceptors that &fopen names under ASan.
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  auto* doallocate = static_cast<const char*>(dlsym(libc, "_IO_file_doallocate"));
  ASSERT_NE(doallocate, nullptr);
  EXPECT_TRUE(calledFromLibcBufferFunction(doallocate + 1));
  for (const char* name : {"fopen", "qsort", "strdup"}) {
    void* function = dlsym(libc, name);
    ASSERT_NE(function, nullptr) << name;
    EXPECT_FALSE(calledFromLibcBufferFunction(function)) << name;
  }
  dlclose(libc);
  EXPECT_FALSE(calledFromLibcBufferFunction(reinterpret_cast<const void*>(&notInLibc)));
  EXPECT_FALSE(calledFromLibcBufferFunction(nullptr));
  int onStack = 0;
  EXPECT_FALSE(calledFromLibcBufferFunction(&onStack));
}

}  // namespace
}  // namespace meshalloc::api

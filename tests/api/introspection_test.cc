// glibc's introspection entry points: malloc_usable_size, malloc_trim, mallinfo(2), mallopt,
// malloc_stats and malloc_info.
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

using meshtest::GlibcReference;

namespace {

// Captures what `body` writes to file descriptor `fd` (through a temporary file).
template <typename Body>
std::string captureFd(int fd, Body body) {
  fflush(nullptr);
  FILE* tmp = tmpfile();
  EXPECT_NE(tmp, nullptr);
  if (!tmp) return {};
  int saved = dup(fd);
  dup2(fileno(tmp), fd);
  body();
  fflush(nullptr);
  dup2(saved, fd);
  close(saved);
  std::string text;
  rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, tmp)) > 0) text.append(buf, n);
  fclose(tmp);
  return text;
}

TEST(MallocUsableSize, NullIsZero) {
  EXPECT_EQ(GlibcReference::get().malloc_usable_size(nullptr), 0u);
  EXPECT_EQ(malloc_usable_size(nullptr), 0u);
}

// The usable size covers the request and every byte of it can be written without touching any
// other live object.
TEST(MallocUsableSize, AtLeastRequestedAndWritableToTheEnd) {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 1024; ++n) sizes.push_back(n);
  for (size_t n = 1025; n <= 20000; n += 29) sizes.push_back(n);
  for (size_t n : {65536u, 65537u, 300000u, (1u << 20) + 5, 4u << 20}) sizes.push_back(n);

  for (size_t n : sizes) {
    const int count = n > 20000 ? 3 : 48;
    std::vector<std::pair<void*, size_t>> objs;
    for (int i = 0; i < count; ++i) {
      void* p = malloc(n);
      ASSERT_NE(p, nullptr);
      size_t usable = malloc_usable_size(p);
      ASSERT_GE(usable, n) << "malloc_usable_size(malloc(" << n << "))";
      // A usable size wildly above the request would make the statistics meaningless.
      ASSERT_LE(usable, n < 4096 ? 2 * n + 64 : n + n / 4 + 65536) << "size " << n;
      meshtest::fillPattern(p, usable, i);
      objs.emplace_back(p, usable);
    }
    for (int i = 0; i < count; ++i) {
      auto [p, usable] = objs[static_cast<size_t>(i)];
      ASSERT_EQ(malloc_usable_size(p), usable);
      size_t bad = meshtest::firstMismatch(p, p, usable, static_cast<uint64_t>(i), usable);
      ASSERT_EQ(bad, SIZE_MAX) << "object of " << n << " bytes (usable " << usable
                               << ") was overwritten at offset " << bad
                               << " by a neighbour written up to its usable end";
      free(p);
    }
  }
}

// The freed pages the dirty cache still holds.
size_t retainedBytes() {
  return meshtest::statBytes("stats.retained");
}

// malloc_trim returns 1 exactly when it gave memory back to the system.
TEST(MallocTrim, ReturnsOneExactlyWhenItReleasedMemory) {
  for (size_t pad : {size_t{0}, size_t{4096}, size_t{1} << 20}) {
    malloc_trim(pad);  // whatever earlier work left behind
    // Nothing left to give back: 0, and the cache stays empty.
    int idle = malloc_trim(pad);
    size_t retainedIdle = retainedBytes();
    EXPECT_EQ(idle, 0) << "malloc_trim(" << pad << ") with nothing to release";
    EXPECT_EQ(retainedIdle, 0u);

    // Large objects freed go to the dirty cache (well under its limit, and trimmed long before
    // they decay), so there is something to release.
    constexpr size_t kObjects = 8, kBytes = 128 << 10;
    void* ptrs[kObjects];
    for (void*& p : ptrs) {
      p = malloc(kBytes);
      ASSERT_NE(p, nullptr);
      memset(p, 1, kBytes);
    }
    for (void* p : ptrs) free(p);
    size_t retainedBefore = retainedBytes();
    int released = malloc_trim(pad);
    size_t retainedAfter = retainedBytes();
    EXPECT_GE(retainedBefore, kObjects * kBytes) << "the freed objects were not cached";
    EXPECT_EQ(released, 1) << "malloc_trim(" << pad << ") with " << retainedBefore
                           << " cached bytes";
    EXPECT_EQ(retainedAfter, 0u) << "malloc_trim(" << pad << ") left pages in the cache";
  }
}

TEST(Mallinfo, Mallinfo2GrowsWhenAllocating) {
  struct mallinfo2 before = mallinfo2();
  std::vector<void*> ptrs;
  const size_t kCount = 20000, kSize = 100;  // 2 MB in small objects
  for (size_t i = 0; i < kCount; ++i) {
    void* p = malloc(kSize);
    ASSERT_NE(p, nullptr);
    memset(p, 1, kSize);
    ptrs.push_back(p);
  }
  struct mallinfo2 during = mallinfo2();
  EXPECT_GE(during.uordblks, before.uordblks + kCount * kSize * 9 / 10)
      << "uordblks " << before.uordblks << " -> " << during.uordblks;
  EXPECT_GT(during.arena + during.hblkhd, 0u);
  EXPECT_LE(during.uordblks, during.arena + during.hblkhd)
      << "more bytes in use than the heap holds";
  for (void* p : ptrs) free(p);
  struct mallinfo2 after = mallinfo2();
  EXPECT_LT(after.uordblks, during.uordblks) << "uordblks did not shrink after freeing";
}

TEST(Mallinfo, LegacyMallinfoAgreesWithMallinfo2) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo legacy = mallinfo();
#pragma GCC diagnostic pop
  struct mallinfo2 current = mallinfo2();
  EXPECT_GT(current.uordblks, 0u);
  // Both are snapshots of a heap the test does not touch in between (apart from nothing), so
  // they agree up to truncation to int.
  EXPECT_EQ(static_cast<size_t>(static_cast<unsigned>(legacy.uordblks)),
            current.uordblks & 0xffffffffu);
}

TEST(Mallopt, KnownParametersReturnOne) {
  struct Case {
    int param;
    int value;
    const char* name;
  };
  const Case cases[] = {
      {M_TRIM_THRESHOLD, 128 * 1024, "M_TRIM_THRESHOLD"},
      {M_TOP_PAD, 0, "M_TOP_PAD"},
      {M_MMAP_THRESHOLD, 128 * 1024, "M_MMAP_THRESHOLD"},
      {M_MMAP_MAX, 65536, "M_MMAP_MAX"},
      {M_ARENA_MAX, 8, "M_ARENA_MAX"},
      {M_ARENA_TEST, 8, "M_ARENA_TEST"},
      {M_PERTURB, 0, "M_PERTURB"},
      {M_MXFAST, 64, "M_MXFAST"},
      {M_CHECK_ACTION, 3, "M_CHECK_ACTION"},
  };
  for (const Case& c : cases) {
    ASSERT_EQ(__libc_mallopt(c.param, c.value), 1) << "reference: glibc mallopt(" << c.name << ")";
    EXPECT_EQ(mallopt(c.param, c.value), 1) << "mallopt(" << c.name << ", " << c.value << ")";
  }
  // The heap still works afterwards.
  void* p = malloc(1000);
  ASSERT_NE(p, nullptr);
  free(p);
}

TEST(MallocStats, WritesAReportToStderr) {
  void* keep = malloc(12345);
  std::string out = captureFd(STDERR_FILENO, [] { malloc_stats(); });
  free(keep);
  EXPECT_GT(out.size(), 20u) << "malloc_stats wrote: '" << out << "'";
}

TEST(MallocInfo, WritesWellFormedXml) {
  void* keep = malloc(12345);
  FILE* tmp = tmpfile();
  ASSERT_NE(tmp, nullptr);
  EXPECT_EQ(malloc_info(0, tmp), 0);
  free(keep);
  std::string text;
  rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, tmp)) > 0) text.append(buf, n);
  fclose(tmp);

  ASSERT_FALSE(text.empty());
  static const std::regex startTag(R"(^\s*(<\?xml[^>]*\?>\s*)?<malloc(\s[^>]*)?>)");
  EXPECT_TRUE(std::regex_search(text, startTag)) << "malloc_info output:\n" << text;
  EXPECT_NE(text.find("</malloc>"), std::string::npos) << "no closing tag:\n" << text;
}

TEST(MallocInfo, NonZeroOptionsAreRejectedLikeGlibc) {
  FILE* devnull = fopen("/dev/null", "w");
  ASSERT_NE(devnull, nullptr);
  int ref = GlibcReference::get().malloc_info(1, devnull);
  ASSERT_NE(ref, 0) << "reference: glibc malloc_info(1, f)";
  EXPECT_EQ(malloc_info(1, devnull), ref);
  fclose(devnull);
}

}  // namespace

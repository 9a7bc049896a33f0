// Invalid frees: each must stop the process with SIGABRT after a one-line report on stderr
// naming the problem and the address, e.g. "meshalloc: double free of 0x7f12345678a0".
// Every case runs in a forked child whose stderr is captured.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "test_support.h"

using meshtest::ChildResult;
using meshtest::hexAddress;
using meshtest::launder;
using meshtest::runInChild;

namespace {

// True if one line of `text` contains "meshalloc:", the address and one of the words.
bool hasReportLine(const std::string& text, const void* address,
                   std::initializer_list<const char*> words) {
  const std::string hex = hexAddress(address);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("meshalloc:") == std::string::npos) continue;
    // The address must not be a prefix of a longer number.
    size_t at = line.find(hex);
    bool addressFound = false;
    while (at != std::string::npos) {
      char next = at + hex.size() < line.size() ? line[at + hex.size()] : ' ';
      if (!isxdigit(static_cast<unsigned char>(next))) addressFound = true;
      at = line.find(hex, at + 1);
    }
    if (!addressFound) continue;
    for (const char* w : words) {
      if (line.find(w) != std::string::npos) return true;
    }
  }
  return false;
}

void expectAbortReport(const ChildResult& r, const void* address,
                       std::initializer_list<const char*> words) {
  EXPECT_TRUE(r.killedBy(SIGABRT)) << "expected SIGABRT; child " << r.describe();
  std::string wanted;
  for (const char* w : words) wanted += std::string(wanted.empty() ? "" : " or ") + "'" + w + "'";
  EXPECT_TRUE(hasReportLine(r.stderrText, address, words))
      << "expected a line with 'meshalloc:', " << hexAddress(address) << " and " << wanted
      << "; child " << r.describe();
}

// The address the child will use, decided before forking so the parent knows it too.
template <typename T>
T* touched(T* p, size_t n) {
  if (p == nullptr) abort();
  memset(p, 0x33, n);
  return p;
}

class DoubleFree : public ::testing::TestWithParam<size_t> {};

TEST_P(DoubleFree, SameThread) {
  const size_t size = GetParam();
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p] {
    free(p);
    free(launder(p));
  });
  expectAbortReport(r, p, {"double free"});
  free(p);
}

// Freed by another thread (a remote free into the owner's span), then again by the owner.
TEST_P(DoubleFree, AfterRemoteFree) {
  const size_t size = GetParam();
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p] {
    std::thread t([p] { free(p); });
    t.join();
    free(launder(p));
  });
  expectAbortReport(r, p, {"double free"});
  free(p);
}

// Freed by its owner (the slot goes back into the owner's shuffle vector), then again by
// another thread: the remote free must not clear the bit of a slot the owner holds free.
TEST_P(DoubleFree, LocalThenRemote) {
  const size_t size = GetParam();
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p] {
    // The thread exists before the first free: with LIFO reuse (randomisation 0, 1 or 3),
    // std::thread's own state object is a 16-byte block and would otherwise get p's slot,
    // making the second free a legal one of that live object.
    std::atomic<bool> freed{false};
    std::thread t([p, &freed] {
      while (!freed.load()) std::this_thread::yield();
      free(launder(p));
    });
    free(p);
    freed.store(true);
    t.join();
  });
  expectAbortReport(r, p, {"double free"});
  free(p);
}

// Freed twice by a thread that does not own the span.
TEST_P(DoubleFree, TwiceFromAnotherThread) {
  const size_t size = GetParam();
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p] {
    std::thread t([p] {
      free(p);
      free(launder(p));
    });
    t.join();
  });
  expectAbortReport(r, p, {"double free"});
  free(p);
}

// Other objects of the same class live around the victim, and a new object is allocated in
// between the two frees (it may or may not reuse the slot; if it does, the second free is a
// legal free of the new object and the child must exit normally instead).
TEST_P(DoubleFree, WithNeighbours) {
  const size_t size = GetParam();
  void* neighbours[32];
  for (auto& n : neighbours) n = touched(malloc(size), size);
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p, size] {
    free(p);
    void* q = malloc(size);
    if (q == p) _exit(77);  // slot reused at once: nothing to detect
    free(launder(p));
  });
  if (!r.exitedWith(77)) expectAbortReport(r, p, {"double free"});
  for (auto& n : neighbours) free(n);
  free(p);
}

std::string sizeName(const ::testing::TestParamInfo<size_t>& param) {
  return "bytes" + std::to_string(param.param);
}

INSTANTIATE_TEST_SUITE_P(SmallSizes, DoubleFree,
                         ::testing::Values(size_t{8}, size_t{64}, size_t{1000}, size_t{16384}),
                         sizeName);

TEST(DoubleFreeLarge, OneMiBObject) {
  const size_t size = size_t{1} << 20;
  void* p = touched(malloc(size), size);
  ChildResult r = runInChild([p] {
    free(p);
    free(launder(p));
  });
  // Once a large object is gone its pages may be too, so either wording is acceptable.
  expectAbortReport(r, p, {"double free", "invalid pointer"});
  free(p);
}

char gStaticArray[8192];

TEST(InvalidFree, StackAddress) {
  alignas(16) char buffer[256];
  memset(buffer, 1, sizeof buffer);
  void* address = buffer + 64;
  ChildResult r = runInChild([address] { free(launder(address)); });
  expectAbortReport(r, address, {"invalid pointer"});
}

TEST(InvalidFree, AddressInsideAStaticArray) {
  void* address = gStaticArray + 4096;
  ChildResult r = runInChild([address] { free(launder(address)); });
  expectAbortReport(r, address, {"invalid pointer"});
}

TEST(InvalidFree, UnalignedStaticAddress) {
  void* address = gStaticArray + 13;
  ChildResult r = runInChild([address] { free(launder(address)); });
  expectAbortReport(r, address, {"invalid pointer"});
}

TEST(InteriorFree, SmallObject) {
  auto* p = static_cast<char*>(touched(malloc(64), 64));
  void* interior = p + 16;
  ChildResult r = runInChild([interior] { free(launder(interior)); });
  expectAbortReport(r, interior, {"interior pointer"});
  free(p);
}

TEST(InteriorFree, SmallObjectFromAnotherThread) {
  auto* p = static_cast<char*>(touched(malloc(64), 64));
  void* interior = p + 16;
  ChildResult r = runInChild([interior] {
    std::thread t([interior] { free(launder(interior)); });
    t.join();
  });
  expectAbortReport(r, interior, {"interior pointer"});
  free(p);
}

TEST(InteriorFree, LargeObjectUnaligned) {
  const size_t size = size_t{1} << 20;
  auto* p = static_cast<char*>(touched(malloc(size), size));
  void* interior = p + 100;
  ChildResult r = runInChild([interior] { free(launder(interior)); });
  expectAbortReport(r, interior, {"interior pointer"});
  free(p);
}

// A page-aligned address inside a large object looks like the start of an allocation.
TEST(InteriorFree, LargeObjectPageAligned) {
  const size_t size = size_t{1} << 20;
  auto* p = static_cast<char*>(touched(malloc(size), size));
  void* interior = p + 65536;
  ChildResult r = runInChild([interior] { free(launder(interior)); });
  expectAbortReport(r, interior, {"interior pointer"});
  free(p);
}

// The checks must not fire on legal frees: a child that frees correctly exits normally.
TEST(ValidFree, DoesNotAbort) {
  ChildResult r = runInChild([] {
    for (size_t n : {size_t{8}, size_t{64}, size_t{16384}, size_t{1} << 20}) {
      void* p = malloc(n);
      std::thread t([p] { free(p); });
      t.join();
      free(malloc(n));
    }
  });
  EXPECT_TRUE(r.exitedWith(0)) << r.describe();
  EXPECT_EQ(r.stderrText.find("meshalloc:"), std::string::npos) << r.stderrText;
}

}  // namespace

// Every replaceable C++ allocation function: plain, array, nothrow, sized, align_val_t.
#include <malloc.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

using meshtest::allocatedBytes;
using meshtest::escape;
using meshtest::isAligned;
using meshtest::launder;

namespace {

const size_t kHugeSizes[] = {SIZE_MAX, SIZE_MAX - 4096, SIZE_MAX / 2 + 1,
                             static_cast<size_t>(PTRDIFF_MAX)};

const size_t kSizes[] = {0, 1, 7, 16, 24, 100, 1000, 4096, 16384, 16385, 100000, 1 << 20};

void touch(void* p, size_t n) {
  ASSERT_NE(p, nullptr);
  memset(p, 0x5C, n);
  escape(p);
}

TEST(OperatorNew, PlainAndArrayFormsRoundTrip) {
  for (size_t n : kSizes) {
    void* a = ::operator new(n);
    touch(a, n);
    EXPECT_TRUE(isAligned(a, n >= 16 ? __STDCPP_DEFAULT_NEW_ALIGNMENT__ : 1));
    EXPECT_GE(malloc_usable_size(a), n);
    ::operator delete(a);

    void* b = ::operator new[](n);
    touch(b, n);
    ::operator delete[](b);

    void* c = ::operator new(n);
    touch(c, n);
    ::operator delete(c, n);  // sized

    void* d = ::operator new[](n);
    touch(d, n);
    ::operator delete[](d, n);  // sized array
  }
}

TEST(OperatorNew, NothrowFormsRoundTrip) {
  for (size_t n : kSizes) {
    void* a = ::operator new(n, std::nothrow);
    touch(a, n);
    ::operator delete(a, std::nothrow);
    void* b = ::operator new[](n, std::nothrow);
    touch(b, n);
    ::operator delete[](b, std::nothrow);
  }
}

TEST(OperatorNew, AlignedFormsHonourTheAlignment) {
  for (size_t a = 1; a <= (size_t{1} << 20); a <<= 1) {
    const std::align_val_t al{a};
    for (size_t n : {size_t{1}, a / 2 + 1, a, 3 * a + 5}) {
      void* p = ::operator new(n, al);
      touch(p, n);
      EXPECT_TRUE(isAligned(p, a)) << "operator new(" << n << ", align " << a << ") = " << p;
      ::operator delete(p, al);

      p = ::operator new[](n, al);
      touch(p, n);
      EXPECT_TRUE(isAligned(p, a)) << "operator new[](" << n << ", align " << a << ")";
      ::operator delete[](p, al);

      p = ::operator new(n, al, std::nothrow);
      touch(p, n);
      EXPECT_TRUE(isAligned(p, a));
      ::operator delete(p, al, std::nothrow);

      p = ::operator new[](n, al, std::nothrow);
      touch(p, n);
      EXPECT_TRUE(isAligned(p, a));
      ::operator delete[](p, al, std::nothrow);

      p = ::operator new(n, al);
      touch(p, n);
      ::operator delete(p, n, al);  // sized + aligned

      p = ::operator new[](n, al);
      touch(p, n);
      ::operator delete[](p, n, al);
    }
  }
}

struct alignas(256) OverAligned {
  unsigned char bytes[300];
};

TEST(OperatorNew, NewExpressionsUseTheReplacedOperators) {
  std::vector<OverAligned*> objs;
  for (int i = 0; i < 100; ++i) {
    auto* o = new OverAligned;
    ASSERT_TRUE(isAligned(o, 256));
    memset(o->bytes, i, sizeof o->bytes);
    objs.push_back(launder(o));
  }
  for (auto* o : objs) delete o;

  auto* arr = launder(new OverAligned[17]);
  ASSERT_TRUE(isAligned(arr, 256));
  delete[] arr;

  // Operator new is served by meshalloc: a few MB of new[] shows up in its statistics.
  const size_t before = allocatedBytes();
  std::vector<char*> blocks;
  for (int i = 0; i < 64; ++i) {
    char* b = launder(new char[65536]);
    memset(b, i, 65536);
    blocks.push_back(b);
  }
  const size_t during = allocatedBytes();
  for (char* b : blocks) delete[] b;
  EXPECT_GE(during, before + 64 * 65536 * 9 / 10)
      << "stats.allocated " << before << " -> " << during << " after 4 MiB of new[]";
}

TEST(OperatorNew, HugeSizesThrowBadAlloc) {
  for (size_t n : kHugeSizes) {
    EXPECT_THROW(escape(::operator new(n)), std::bad_alloc) << n;
    EXPECT_THROW(escape(::operator new[](n)), std::bad_alloc) << n;
    EXPECT_THROW(escape(::operator new (n, std::align_val_t{64})), std::bad_alloc) << n;
    EXPECT_THROW(escape(::operator new[](n, std::align_val_t{4096})), std::bad_alloc) << n;
  }
  volatile size_t count = SIZE_MAX / 4;
  EXPECT_THROW(escape(new uint64_t[count]), std::bad_alloc);
}

TEST(OperatorNew, HugeSizesNothrowReturnNull) {
  for (size_t n : kHugeSizes) {
    EXPECT_EQ(launder(::operator new(n, std::nothrow)), nullptr) << n;
    EXPECT_EQ(launder(::operator new[](n, std::nothrow)), nullptr) << n;
    EXPECT_EQ(launder(::operator new (n, std::align_val_t{64}, std::nothrow)), nullptr) << n;
    EXPECT_EQ(launder(::operator new[](n, std::align_val_t{64}, std::nothrow)), nullptr) << n;
  }
}

int gHandlerCalls = 0;
void countingHandler() {
  ++gHandlerCalls;
  std::set_new_handler(nullptr);  // the next failure throws
}

// operator new calls the installed new_handler before giving up.
TEST(OperatorNew, CallsTheNewHandlerBeforeThrowing) {
  gHandlerCalls = 0;
  std::set_new_handler(countingHandler);
  EXPECT_THROW(escape(::operator new(SIZE_MAX / 2)), std::bad_alloc);
  EXPECT_EQ(gHandlerCalls, 1);

  gHandlerCalls = 0;
  std::set_new_handler(countingHandler);
  EXPECT_EQ(launder(::operator new(SIZE_MAX / 2, std::nothrow)), nullptr);
  EXPECT_EQ(gHandlerCalls, 1) << "nothrow new must also consult the new_handler";

  gHandlerCalls = 0;
  std::set_new_handler(countingHandler);
  EXPECT_THROW(escape(::operator new (SIZE_MAX / 2, std::align_val_t{128})), std::bad_alloc);
  EXPECT_EQ(gHandlerCalls, 1);
  std::set_new_handler(nullptr);
}

// operator new keeps calling the handler while it stays installed.
size_t gRetryCalls = 0;
void releasingHandler() {
  ++gRetryCalls;
  if (gRetryCalls > 3) std::set_new_handler(nullptr);
}

TEST(OperatorNew, NewHandlerIsCalledRepeatedlyUntilItGivesUp) {
  gRetryCalls = 0;
  std::set_new_handler(releasingHandler);
  EXPECT_THROW(escape(::operator new(SIZE_MAX - 1)), std::bad_alloc);
  EXPECT_EQ(gRetryCalls, 4u);
  std::set_new_handler(nullptr);
}

}  // namespace

// Buffers that glibc allocates and then has the kernel fill from inside itself: a stream's
// buffer (stdio allocates it on the first read and fills it with its internal read()) and
// getcwd(NULL, 0)'s. Those reads bypass the system-call wrappers (api/io_exports.cc), so a span
// being meshed under such a buffer would make them fail with EFAULT. malloc tells these
// allocations by their caller's address, inside one of the glibc functions below, and takes
// them from spans that are never meshed (heap::allocatePinned). Nothing else glibc allocates
// is pinned (its qsort temporaries, strdup copies and FILE objects are never written by the
// kernel), so no other span loses its meshing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc::api {

struct CodeRange {
  uintptr_t start = 0;
  uintptr_t end = 0;
  bool contains(uintptr_t address) const { return address - start < end - start; }
};
// _IO_file_doallocate (stdio's buffers) and getcwd.
constexpr size_t kLibcBufferFunctions = 2;
inline CodeRange gLibcBufferCallers[kLibcBufferFunctions];
// The smallest range holding all of them: malloc's fast path tests only this one. As a start
// and a size, so that the test loads the size instead of computing it (3 instructions).
struct CodeSpan {
  uintptr_t start = 0;
  uintptr_t size = 0;
  bool contains(uintptr_t address) const { return address - start < size; }
};
inline CodeSpan gLibcBufferCallerSpan;

// Finds those functions' code (once, at load: before the program's constructors open any
// stream). Returns how many were found.
size_t findLibcBufferCallers();

// malloc's fast path tests only gLibcBufferCallerSpan on every call (api/exports.cc): one range
// holds every caller, so the program's own calls (outside glibc) are told apart with one
// comparison, and this exact test runs only for calls from inside the range.
bool calledFromLibcBufferFunction(const void* returnAddress);

}  // namespace meshalloc::api

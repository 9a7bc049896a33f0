// Buffers that glibc allocates and then has the kernel fill from inside itself (stdio's
// buffers, read through glibc's internal read(); getcwd(NULL, 0)'s). Those reads bypass the
// system-call wrappers (api/io_exports.cc), so a span being meshed under such a buffer would make
// them fail with EFAULT. malloc tells these allocations by their caller's address and takes
// them from spans that are never meshed (heap::allocatePinned).
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc::api {

// Smaller blocks are not pinned: stdio's buffers are st_blksize bytes (at least 512 on every
// Linux file system, 1 KiB on /proc, 4 KiB on most) or BUFSIZ. glibc's own small allocations
// (its strdup, its FILE objects) are never written by the kernel.
constexpr size_t kLibcBufferMinBytes = 512;

struct CodeRange {
  uintptr_t start = 0;
  uintptr_t end = 0;
};
inline CodeRange gLibcCode;

// Finds glibc's code (once, at load: before the program's constructors open any stream).
void findLibcCode();

inline bool calledFromLibc(const void* returnAddress) {
  uintptr_t address = reinterpret_cast<uintptr_t>(returnAddress);
  return address - gLibcCode.start < gLibcCode.end - gLibcCode.start;
}

}  // namespace meshalloc::api

#include "api/libc_buffers.h"

#include "platform/os.h"

extern "C" void __libc_free(void* pointer);

namespace meshalloc::api {

void findLibcCode() {
  uintptr_t start, end;
  if (os::findCodeSegment(reinterpret_cast<const void*>(&__libc_free), &start, &end)) {
    gLibcCode.start = start;
    gLibcCode.end = end;
  }
}

}  // namespace meshalloc::api

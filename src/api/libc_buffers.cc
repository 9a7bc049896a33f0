#include "api/libc_buffers.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>

#include "api/export.h"
#include "api/next_symbol.h"
#include "heap/heap.h"
#include "mesh/mesher.h"

namespace meshalloc::api {

size_t findLibcBufferCallers() {
  static const char* const kNames[kLibcBufferFunctions] = {"_IO_file_doallocate", "getcwd"};
  size_t found = 0;
  for (size_t i = 0; i < kLibcBufferFunctions; i++) {
    // RTLD_NEXT: glibc's own function even if the program defines one of that name.
    void* function = dlsym(RTLD_NEXT, kNames[i]);
    Dl_info info;
    void* entry = nullptr;  // dladdr1 hands back the symbol's ElfW(Sym) here
    if (!function || !dladdr1(function, &info, &entry, RTLD_DL_SYMENT) || !entry ||
        static_cast<const ElfW(Sym)*>(entry)->st_size == 0) {
      continue;
    }
    uintptr_t start = reinterpret_cast<uintptr_t>(function);
    gLibcBufferCallers[i] = {start, start + static_cast<const ElfW(Sym)*>(entry)->st_size};
    found++;
  }
  CodeRange span{UINTPTR_MAX, 0};
  for (const CodeRange& range : gLibcBufferCallers) {
    if (range.start == range.end) continue;
    span.start = range.start < span.start ? range.start : span.start;
    span.end = range.end > span.end ? range.end : span.end;
  }
  if (found) gLibcBufferCallerSpan = {span.start, span.end - span.start};
  return found;
}

bool calledFromLibcBufferFunction(const void* returnAddress) {
  for (const CodeRange& range : gLibcBufferCallers) {
    if (range.contains(reinterpret_cast<uintptr_t>(returnAddress))) return true;
  }
  return false;
}

}  // namespace meshalloc::api

namespace {

// A buffer the program gives a stream is filled by glibc's internal read(), like the buffers
// glibc allocates itself: its spans are pinned, and a pass that may have taken one of them
// before is waited out.
void pinStreamBuffer(const char* buffer, size_t size) {
  if (!buffer || size == 0 || !meshalloc::heap::ensureInitialized()) return;
  meshalloc::heap::pinSpansUnder(buffer, size);
  meshalloc::Mesher::waitForPass();
}

}  // namespace

MESHALLOC_EXPORT int setvbuf(FILE* stream, char* buffer, int mode, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(setvbuf);
  if (mode != _IONBF) pinStreamBuffer(buffer, size);
  return real(stream, buffer, mode, size);
}

// glibc's setbuf and setbuffer do not go through setvbuf's symbol.
MESHALLOC_EXPORT void setbuf(FILE* stream, char* buffer) {
  auto real = MESHALLOC_NEXT_SYMBOL(setbuf);
  pinStreamBuffer(buffer, BUFSIZ);
  real(stream, buffer);
}

MESHALLOC_EXPORT void setbuffer(FILE* stream, char* buffer, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(setbuffer);
  pinStreamBuffer(buffer, size);
  real(stream, buffer, size);
}

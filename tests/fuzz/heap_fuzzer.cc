// libFuzzer target: each input is a program for the heap driver (heap_driver.h). Built by the
// `fuzz` preset with clang, -fsanitize=fuzzer,address,undefined, against meshalloc_core: the
// allocator is called through its api::*Impl entry points, so ASan keeps the process's own malloc.
// Run it with `make fuzz` (long) or `make fuzz-short` (the fixed run inside `make test`).
#include <stdio.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>

#include "heap_driver.h"

namespace {

void printSummary() {
  const meshalloc::fuzz::ProgramStats& t = meshalloc::fuzz::totals();
  fprintf(stderr,
          "heap fuzzer: %llu operations, %llu remote frees, %llu compacts (%llu spans meshed "
          "away), %llu forks, %llu impossible requests refused\n",
          static_cast<unsigned long long>(t.operations),
          static_cast<unsigned long long>(t.remoteFrees),
          static_cast<unsigned long long>(t.compacts),
          static_cast<unsigned long long>(meshalloc::fuzz::meshedSpans()),
          static_cast<unsigned long long>(t.forks),
          static_cast<unsigned long long>(t.failedAsExpected));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(printSummary);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meshalloc::fuzz::runHeapProgram(data, size);
  return 0;
}

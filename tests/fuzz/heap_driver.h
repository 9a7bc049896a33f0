// The heap fuzzer's driver: the input bytes are a program of allocator calls (every entry point
// of api/entry_points.h, malloc_usable_size, frees on a second thread, meshalloc_compact and
// fork) over a set of live blocks whose contents are checked. Shared by the libFuzzer target
// (heap_fuzzer.cc, clang) and the replay test (replay_test.cc, every build), so that a crash the
// fuzzer finds becomes a regression test that runs the same code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc::fuzz {

// What one program did, for the fuzzer's summary and the tests.
struct ProgramStats {
  uint64_t operations = 0;
  uint64_t remoteFrees = 0;
  uint64_t compacts = 0;
  uint64_t forks = 0;
  uint64_t failedAsExpected = 0;  // impossible requests answered with NULL and ENOMEM/EINVAL
};

// Runs the program in `data`. Every wrong answer (a block whose contents changed, a misaligned
// or too small block, a valid request that failed, an impossible one that did not fail with
// ENOMEM, a forked child that saw other contents) prints what went wrong on stderr and aborts.
// At the end every block still live is checked and freed, and the second thread is idle.
ProgramStats runHeapProgram(const uint8_t* data, size_t size);

// Totals over every program run in this process.
const ProgramStats& totals();
// meshalloc's own count of spans meshed away since start (Mesher::stats().meshedSpans).
uint64_t meshedSpans();

}  // namespace meshalloc::fuzz

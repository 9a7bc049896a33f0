// MESHALLOC_ASSERT(condition) and MESHALLOC_ASSERT_MSG(condition, message): run-time checks of
// the invariants the code relies on. Compiled in when MESHALLOC_CHECKS is 1 (CMake sets it for
// Debug builds and for the ASan/UBSan and TSan builds, so every unit and sanitizer run checks
// them); in release the condition is still parsed and type-checked but never evaluated, and no
// code is generated. A failed check allocates nothing: it formats into a stack buffer, writes
// "meshalloc: assertion failed: <expr> (<file>:<line>)" to stderr and aborts.
#pragma once

#include "platform/os.h"
#include "support/text_writer.h"

#if defined(MESHALLOC_CHECKS) && MESHALLOC_CHECKS
#define MESHALLOC_CHECKS_ENABLED 1
#else
#define MESHALLOC_CHECKS_ENABLED 0
#endif

namespace meshalloc {

inline constexpr bool kChecksEnabled = MESHALLOC_CHECKS_ENABLED;

[[noreturn, gnu::cold, gnu::noinline]] inline void assertionFailed(const char* expression,
                                                                   const char* message,
                                                                   const char* file, int line) {
  char buffer[512];
  TextWriter out(buffer, sizeof(buffer));
  out.text("meshalloc: assertion failed: ").text(expression);
  if (message) out.text(": ").text(message);
  out.text(" (").text(file).text(":").signedValue(line).text(")\n");
  os::writeStderr(out.data(), out.length());
  if (out.truncated()) os::writeStderr("\n", 1);
  os::abortProcess();
}

}  // namespace meshalloc

#define MESHALLOC_ASSERT_MSG(condition, message)                               \
  do {                                                                         \
    if constexpr (::meshalloc::kChecksEnabled) {                               \
      if (__builtin_expect(!(condition), 0))                                   \
        ::meshalloc::assertionFailed(#condition, message, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

#define MESHALLOC_ASSERT(condition) MESHALLOC_ASSERT_MSG(condition, nullptr)

// Misuse of the heap (double free, foreign or interior pointers) is reported with the address
// on stderr and the process aborts: continuing would corrupt memory silently.
#pragma once

namespace meshalloc {

enum class HeapError {
  kDoubleFree,       // the slot is already free
  kInvalidPointer,   // not an address meshalloc handed out
  kInteriorPointer,  // inside an object, not at its start
  kStalePointer,     // inside the heap, but in no live span: freed twice or never allocated
};

[[noreturn]] void reportHeapError(HeapError error, const char* operation, const void* address,
                                  const void* objectStart = nullptr);

}  // namespace meshalloc

// Misuse of the heap (double free, foreign or interior pointers) is reported with the address
// on stderr and the process aborts: continuing would corrupt memory silently.
#pragma once

namespace meshalloc {

enum class HeapError {
  kDoubleFree,       // the slot is already free
  kInvalidPointer,   // not an address meshalloc handed out
  kInteriorPointer,  // inside an object, not at its start
  kStalePointer,     // inside the heap, but in no live span: freed twice or never allocated
  // Handles (src/handle/, docs/handles.md); `address` is then the handle's 64-bit value.
  kInvalidHandle,   // not a handle meshalloc made: no tag bit, or an index never handed out
  kStaleHandle,     // a handle whose object was freed (its generation is not the entry's)
  kPinnedHandle,    // freed or resized while pinned
  kUnpinnedHandle,  // unpinned more often than pinned
};

[[noreturn]] void reportHeapError(HeapError error, const char* operation, const void* address,
                                  const void* objectStart = nullptr);

}  // namespace meshalloc

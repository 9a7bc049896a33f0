#include "heap/errors.h"

#include <cstdint>

#include "platform/os.h"
#include "support/text_writer.h"

namespace meshalloc {

void reportHeapError(HeapError error, const char* operation, const void* address,
                     const void* objectStart) {
  constexpr size_t kMessageCapacity = 256;
  char buffer[kMessageCapacity];
  TextWriter out(buffer, sizeof(buffer));
  out.text("meshalloc: ");
  switch (error) {
    case HeapError::kDoubleFree:
      out.text("double free of ").pointer(address);
      break;
    case HeapError::kInvalidPointer:
      out.text("free of invalid pointer ").pointer(address).text(" (not allocated by meshalloc)");
      break;
    case HeapError::kInteriorPointer:
      out.text("free of interior pointer ").pointer(address);
      if (objectStart) out.text(" (the object starts at ").pointer(objectStart).text(")");
      break;
    case HeapError::kStalePointer:
      out.text("double free or invalid pointer ")
          .pointer(address)
          .text(" (its span holds no live objects)");
      break;
    case HeapError::kInvalidHandle:
      out.text("invalid handle ").pointer(address).text(" (not made by mh_alloc)");
      break;
    case HeapError::kStaleHandle:
      out.text("stale handle ").pointer(address).text(" (its object was freed)");
      break;
    case HeapError::kPinnedHandle:
      out.text("handle ").pointer(address).text(" is pinned");
      break;
    case HeapError::kUnpinnedHandle:
      out.text("handle ").pointer(address).text(" is not pinned");
      break;
  }
  out.text(" in ").text(operation).text("; aborting\n");
  os::writeStderr(out.data(), out.length());
  os::abortProcess();
}

}  // namespace meshalloc

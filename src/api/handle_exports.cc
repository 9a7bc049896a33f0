// The exported handle API (include/meshalloc_handle.h), over handle/.
#include "api/export.h"
#include "handle/handles.h"
#include "meshalloc_handle.h"
#include "platform/os.h"

using namespace meshalloc;

MESHALLOC_EXPORT mh_t mh_alloc(size_t size) {
  return handles::allocate(size);
}
MESHALLOC_EXPORT mh_t mh_calloc(size_t count, size_t size) {
  return handles::allocateZeroed(count, size);
}
MESHALLOC_EXPORT mh_t mh_realloc(mh_t handle, size_t size) {
  return handles::reallocate(handle, size);
}
MESHALLOC_EXPORT void mh_free(mh_t handle) {
  handles::free(handle);
}
MESHALLOC_EXPORT size_t mh_usable_size(mh_t handle) {
  return handles::usableSize(handle);
}
MESHALLOC_EXPORT void* mh_pin(mh_t handle) {
  return handles::pin(handle);
}
MESHALLOC_EXPORT void mh_unpin(mh_t handle) {
  handles::unpin(handle);
}
MESHALLOC_EXPORT size_t mh_compact(uint64_t budget_ns) {
  return handles::compact(budget_ns ? os::monotonicNanos() + budget_ns : 0);
}

// The two ways the cache keeps its entries (docs/handles-bench.md): raw malloc pointers, the
// baseline, and meshalloc handles (include/meshalloc_handle.h), which the allocator may move.
// The store is written once against this interface and instantiated for both, so the two
// servers differ only in these calls.
//
// The mh_* functions are weak references: the server binary does not link libmeshalloc (the
// malloc backend must run under glibc, jemalloc or any preloaded allocator), and the dynamic
// loader binds them to the preloaded libmeshalloc.so when there is one. Without it they stay
// null and the handles backend refuses to start (HandleStorage::available).
#ifndef HANDLE_CACHE_STORAGE_H
#define HANDLE_CACHE_STORAGE_H

#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meshalloc.h"
#include "meshalloc_handle.h"

#pragma weak mh_alloc
#pragma weak mh_free
#pragma weak mh_usable_size
#pragma weak mh_pin
#pragma weak mh_unpin
#pragma weak mh_compact
#pragma weak meshalloc_mallctl
#pragma weak meshalloc_print_stats

namespace handle_cache {

// A reference to one stored object: a pointer's bits or a handle; 0 is "none" in both.
using Ref = uint64_t;

struct MallocStorage {
  static constexpr const char* kName = "malloc";
  static bool available() { return true; }
  static Ref allocate(size_t size) { return reinterpret_cast<uintptr_t>(malloc(size)); }
  static void release(Ref ref) { free(reinterpret_cast<void*>(ref)); }
  static size_t usable(Ref ref) { return malloc_usable_size(reinterpret_cast<void*>(ref)); }
  static void* pin(Ref ref) { return reinterpret_cast<void*>(ref); }
  static void unpin(Ref) {}
  static size_t compact(uint64_t) { return 0; }
};

struct HandleStorage {
  static constexpr const char* kName = "handles";
  static bool available() {
    return mh_alloc != nullptr && mh_free != nullptr && mh_usable_size != nullptr &&
           mh_pin != nullptr && mh_unpin != nullptr && mh_compact != nullptr;
  }
  static Ref allocate(size_t size) { return mh_alloc(size); }
  static void release(Ref ref) { mh_free(ref); }
  static size_t usable(Ref ref) { return mh_usable_size(ref); }
  static void* pin(Ref ref) { return mh_pin(ref); }
  static void unpin(Ref ref) { mh_unpin(ref); }
  static size_t compact(uint64_t budget_ns) { return mh_compact(budget_ns); }
  // meshalloc's "handles.<name>" statistic (moved, cpu_ns, ...); 0 when it has none.
  static uint64_t statistic(const char* name) {
    char full[64] = "handles.";
    strncat(full, name, sizeof full - strlen(full) - 1);
    uint64_t value = 0;
    size_t length = sizeof value;
    if (meshalloc_mallctl == nullptr || meshalloc_mallctl(full, &value, &length, nullptr, 0) != 0) {
      return 0;
    }
    return value;
  }
};

// The object behind `ref`, pinned for this scope (a no-op for malloc pointers).
template <typename Storage, typename T>
class Pinned {
 public:
  explicit Pinned(Ref ref) : ref_(ref), object_(static_cast<T*>(Storage::pin(ref))) {}
  ~Pinned() { Storage::unpin(ref_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  T* operator->() const { return object_; }
  T* get() const { return object_; }

 private:
  Ref ref_;
  T* object_;
};

}  // namespace handle_cache

#endif

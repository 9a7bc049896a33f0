// The next definition of a symbol we interpose (glibc's, normally), looked up once with
// dlsym(RTLD_NEXT) and cached, so that wrappers call the real function with glibc's own
// cancellation points and errno behaviour.
#pragma once

#include <dlfcn.h>

#include <atomic>

namespace meshalloc::api {

template <typename Function>
Function nextSymbol(std::atomic<Function>& cache, const char* name) {
  Function f = cache.load(std::memory_order_acquire);
  if (!f) {
    f = reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
    cache.store(f, std::memory_order_release);
  }
  return f;
}

}  // namespace meshalloc::api

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

// A function pointer's type without the attributes glibc's declarations carry (nonnull,
// warn_unused_result, ...), which a template argument would ignore, with a warning.
template <typename Result, typename... Arguments>
auto plainFunction(Result (*)(Arguments...)) -> Result (*)(Arguments...);

}  // namespace meshalloc::api

// The real `function` for a wrapper of the same name and type (used inside the wrapper, where
// `::function` is the wrapper itself, so the type is the wrapped function's own): one cache per
// function, constant-initialised, so it needs no guard and no constructor.
#define MESHALLOC_NEXT_SYMBOL(function)                                      \
  ([]() {                                                                    \
    using Function = decltype(::meshalloc::api::plainFunction(&::function)); \
    static constinit std::atomic<Function> cache{nullptr};                   \
    return ::meshalloc::api::nextSymbol(cache, #function);                   \
  }())

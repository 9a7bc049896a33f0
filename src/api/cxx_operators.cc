// C++ operator new/delete in every form. The core is built without exceptions and must not
// depend on libstdc++, so a failed throwing new looks up the program's new-handler and
// std::__throw_bad_alloc at run time: a C++ program always has libstdc++ loaded, and then gets
// the standard behaviour (handler loop, then std::bad_alloc).
#include <dlfcn.h>

#include <cstddef>
#include <new>

#include "api/export.h"
#include "heap/heap.h"
#include "platform/os.h"

namespace {

using NewHandler = void (*)();
using GetNewHandler = NewHandler (*)();
using ThrowBadAlloc = void (*)();

[[noreturn]] void throwBadAlloc() {
  auto thrower = reinterpret_cast<ThrowBadAlloc>(dlsym(RTLD_DEFAULT, "_ZSt17__throw_bad_allocv"));
  if (thrower) thrower();
  static const char kMessage[] =
      "meshalloc: operator new: out of memory and std::bad_alloc unavailable; aborting\n";
  meshalloc::os::writeStderr(kMessage, sizeof(kMessage) - 1);
  meshalloc::os::abortProcess();
}

NewHandler currentNewHandler() {
  auto getter = reinterpret_cast<GetNewHandler>(dlsym(RTLD_DEFAULT, "_ZSt15get_new_handlerv"));
  return getter ? getter() : nullptr;
}

// The standard's loop: call the new-handler until allocation succeeds or there is none.
template <typename Allocate>
void* newOrThrow(Allocate allocate) {
  for (;;) {
    if (void* block = allocate()) return block;
    NewHandler handler = currentNewHandler();
    if (!handler) throwBadAlloc();
    handler();
  }
}

// nothrow forms run the same handler loop but return nullptr once no handler is installed.
// (A handler that throws from here terminates: catching needs libstdc++'s unwinder, which the
// library does not link.)
template <typename Allocate>
void* newOrNull(Allocate allocate) {
  for (;;) {
    if (void* block = allocate()) return block;
    NewHandler handler = currentNewHandler();
    if (!handler) return nullptr;
    handler();
  }
}

void* newSizedNothrow(std::size_t size) {
  return newOrNull([size] { return meshalloc::heap::allocate(size); });
}

void* newAlignedNothrow(std::size_t size, std::align_val_t alignment) {
  return newOrNull(
      [=] { return meshalloc::heap::allocateAligned(size, static_cast<std::size_t>(alignment)); });
}

void* newSized(std::size_t size) {
  void* block = meshalloc::heap::allocate(size);
  return block ? block : newOrThrow([size] { return meshalloc::heap::allocate(size); });
}

void* newAligned(std::size_t size, std::align_val_t alignment) {
  auto allocate = [=] {
    return meshalloc::heap::allocateAligned(size, static_cast<std::size_t>(alignment));
  };
  void* block = allocate();
  return block ? block : newOrThrow(allocate);
}

}  // namespace

MESHALLOC_EXPORT_CXX void* operator new(std::size_t size) {
  return newSized(size);
}
MESHALLOC_EXPORT_CXX void* operator new[](std::size_t size) {
  return newSized(size);
}
MESHALLOC_EXPORT_CXX void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return newSizedNothrow(size);
}
MESHALLOC_EXPORT_CXX void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return newSizedNothrow(size);
}
MESHALLOC_EXPORT_CXX void* operator new(std::size_t size, std::align_val_t alignment) {
  return newAligned(size, alignment);
}
MESHALLOC_EXPORT_CXX void* operator new[](std::size_t size, std::align_val_t alignment) {
  return newAligned(size, alignment);
}
MESHALLOC_EXPORT_CXX void* operator new(std::size_t size, std::align_val_t alignment,
                                        const std::nothrow_t&) noexcept {
  return newAlignedNothrow(size, alignment);
}
MESHALLOC_EXPORT_CXX void* operator new[](std::size_t size, std::align_val_t alignment,
                                          const std::nothrow_t&) noexcept {
  return newAlignedNothrow(size, alignment);
}

MESHALLOC_EXPORT_CXX void operator delete(void* p) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete(void* p, const std::nothrow_t&) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p, const std::nothrow_t&) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete(void* p, std::size_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p, std::size_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete(void* p, std::align_val_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p, std::align_val_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete(void* p, std::align_val_t,
                                          const std::nothrow_t&) noexcept {
  meshalloc::heap::deallocate(p);
}
MESHALLOC_EXPORT_CXX void operator delete[](void* p, std::align_val_t,
                                            const std::nothrow_t&) noexcept {
  meshalloc::heap::deallocate(p);
}

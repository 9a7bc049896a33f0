/* meshalloc handles: relocatable objects (docs/handles.md).
 *
 * A handle names an object that the allocator may move to compact the heap. The program
 * reaches the object only through mh_pin, which returns a pointer that stays valid until the
 * matching mh_unpin; a pinned object is never moved. A background defragmenter (and
 * mh_compact) moves unpinned objects out of sparse memory into dense memory and returns the
 * pages it empties, concurrently with the program: a thread that pins an object while it is
 * being moved either waits for that one object or cancels the move.
 *
 * A handle is an opaque 64-bit value, never a valid pointer, carrying a generation so that a
 * freed, stale or forged handle is detected: using one prints the handle on stderr and
 * aborts, like an invalid free. MH_NULL is never a valid handle.
 *
 * Statistics are read through meshalloc_mallctl under "handles.*" (see meshalloc.h).
 */
#ifndef MESHALLOC_HANDLE_H
#define MESHALLOC_HANDLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t mh_t;
#define MH_NULL ((mh_t)0)

/* A new object of `size` bytes (0 is allowed). Returns MH_NULL with errno ENOMEM when the
 * object or its handle cannot be allocated. */
mh_t mh_alloc(size_t size);
/* As mh_alloc, zero-filled; MH_NULL with ENOMEM when n * size overflows. */
mh_t mh_calloc(size_t n, size_t size);
/* Resizes the object of `h`, keeping its contents up to the smaller size. The handle stays
 * the same; no pin of it may be held across the call (resizing a pinned object aborts).
 * Returns `h`, or MH_NULL with ENOMEM and the object unchanged. mh_realloc(MH_NULL, n) is
 * mh_alloc(n). */
mh_t mh_realloc(mh_t h, size_t size);
/* Frees the object and retires the handle. MH_NULL is a no-op; freeing a pinned object
 * aborts. */
void mh_free(mh_t h);
/* Bytes usable in the object (at least the size asked for). */
size_t mh_usable_size(mh_t h);

/* The object's address, valid until the matching mh_unpin. Pins nest and may be taken by
 * several threads at once. */
void* mh_pin(mh_t h);
void mh_unpin(mh_t h);

/* One explicit defragmentation pass, limited to `budget_ns` nanoseconds (0: until nothing
 * more can be gained). Returns the bytes given back to the operating system. */
size_t mh_compact(uint64_t budget_ns);

#ifdef __cplusplus
}

namespace meshalloc {

/* RAII pin: `pinned<Node> p(h); p->next = ...;` unpins when it goes out of scope. */
template <typename T>
class pinned {
 public:
  explicit pinned(mh_t handle) : handle_(handle), pointer_(static_cast<T*>(mh_pin(handle))) {}
  ~pinned() {
    if (handle_ != MH_NULL) mh_unpin(handle_);
  }
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;
  pinned(pinned&& other) noexcept : handle_(other.handle_), pointer_(other.pointer_) {
    other.handle_ = MH_NULL;
    other.pointer_ = nullptr;
  }
  pinned& operator=(pinned&&) = delete;

  T* get() const { return pointer_; }
  T* operator->() const { return pointer_; }
  T& operator*() const { return *pointer_; }

 private:
  mh_t handle_;
  T* pointer_;
};

}  // namespace meshalloc
#endif

#endif /* MESHALLOC_HANDLE_H */

// Per-thread heap: one shuffle vector per size class, each holding the free slots of the span
// attached to this thread. malloc pops a slot and free of a slot of an attached span pushes it
// back, with no atomics and no locks; everything else goes to the global heap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/config.h"
#include "heap/mini_heap.h"
#include "heap/size_class.h"
#include "support/rng.h"

namespace meshalloc {

struct ShuffleVector {
  uint32_t length = 0;  // free slots available, popped from the end
  uint32_t objectSize = 0;
  uintptr_t spanStart = 0;
  MiniHeap* attached = nullptr;
  uint16_t* slots = nullptr;    // capacity: the class's objects per span
  uint64_t* inVector = nullptr;  // bit per slot: set while the slot sits in `slots`

  bool contains(size_t slot) const { return (inVector[slot / 64] >> (slot % 64)) & 1; }

  void* pop() {
    uint32_t slot = slots[--length];
    inVector[slot / 64] &= ~(1ull << (slot % 64));
    return reinterpret_cast<void*>(spanStart + static_cast<uintptr_t>(slot) * objectSize);
  }

  void push(uint32_t slot) {
    inVector[slot / 64] |= 1ull << (slot % 64);
    slots[length++] = static_cast<uint16_t>(slot);
  }

  // Pushes, then swaps the new entry with a random one: the vector stays a uniform shuffle.
  void pushRandomly(uint32_t slot, Rng& rng) {
    inVector[slot / 64] |= 1ull << (slot % 64);
    uint32_t position = rng.below(length + 1);
    slots[length++] = slots[position];
    slots[position] = static_cast<uint16_t>(slot);
  }
};

class ThreadHeap {
 public:
  // A heap for the calling thread (reusing one a finished thread left), or nullptr.
  static ThreadHeap* create();
  // Returns every attached span to the global heap and puts this heap up for reuse.
  void retire();

  // Refills the vector of `sizeClass`; false when memory is exhausted.
  bool refill(unsigned sizeClass);
  // Returns the vector's slots and its span to the global heap (e.g. "thread.tcache.flush").
  void detach(unsigned sizeClass);
  void detachAll();

  ShuffleVector& vector(unsigned sizeClass) { return vectors_[sizeClass]; }
  Rng& rng() { return rng_; }
  Randomization randomization() const { return randomization_; }
  ThreadHeap* nextInRegistry() const { return registryNext_; }
  bool inUse() const { return inUse_; }

  // Every heap ever created, for statistics and fork handling.
  static ThreadHeap* registryHead();
  static void lockRegistry();
  static void unlockRegistry();
  static void resetRegistryAfterFork();

 private:
  static size_t storageBytes();
  void initialize(char* storage);
  void fill(ShuffleVector& vector, MiniHeap* heap);

  ShuffleVector vectors_[kNumSizeClasses];
  Rng rng_;
  Randomization randomization_ = Randomization::kOnRefillAndFree;
  bool inUse_ = false;
  ThreadHeap* registryNext_ = nullptr;
  ThreadHeap* poolNext_ = nullptr;
};

// initial-exec TLS: one %fs-relative load on the fast path, valid even for LD_PRELOAD since
// glibc reserves static TLS surplus for preloaded libraries.
extern thread_local ThreadHeap* tlsThreadHeap __attribute__((tls_model("initial-exec")));

}  // namespace meshalloc

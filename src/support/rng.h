// Small, fast per-thread random number generator (xoshiro256** family). Allocation order is
// randomised for meshing, not for security, so statistical quality and speed are what matter.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

class Rng {
 public:
  // constexpr: a ThreadHeap (which holds one) can be constant-initialised (the empty heap the
  // fast paths read before a thread has its own, heap/thread_heap.h).
  constexpr explicit Rng(uint64_t seed = 0x9e3779b97f4a7c15ull) { reseed(seed); }
  // No state (all zeros, from which xoshiro yields only zeros) until reseed: for an object that
  // must be constant-initialised to zeros, so that it lands in .bss and costs no page of the
  // library's data until written (the empty thread heap).
  struct Unseeded {};
  constexpr explicit Rng(Unseeded) {}

  constexpr void reseed(uint64_t seed) {
    for (auto& word : state_) {
      seed += 0x9e3779b97f4a7c15ull;  // splitmix64 expands one seed into the four state words
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word = z ^ (z >> 31);
    }
  }

  uint64_t next() {
    uint64_t result = rotl(state_[1] * 5, 7) * 9;
    uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, bound) by Lemire's multiply-shift; the tiny bias is irrelevant here.
  uint32_t below(uint32_t bound) {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(next() >> 32) * bound) >> 32);
  }

  // Fisher-Yates: every order of items[0, count) equally likely.
  template <typename T>
  void shuffle(T* items, size_t count) {
    for (size_t i = count; i > 1; i--) {
      size_t j = below(static_cast<uint32_t>(i));
      T t = items[i - 1];
      items[i - 1] = items[j];
      items[j] = t;
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4] = {};
};

}  // namespace meshalloc

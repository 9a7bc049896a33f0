// Allocation bitmap of a span: bit i set means slot i is owned (handed to the program or held in
// a thread's shuffle vector). Frees from other threads clear bits concurrently, so every
// mutation is an atomic read-modify-write on a 64-bit word.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace meshalloc {

class AtomicBitmap {
 public:
  static constexpr size_t kBitsPerWord = 64;
  static constexpr size_t wordsFor(size_t bits) { return (bits + kBitsPerWord - 1) / kBitsPerWord; }

  AtomicBitmap(std::atomic<uint64_t>* words, size_t bits) : words_(words), bits_(bits) {}

  size_t bits() const { return bits_; }
  size_t words() const { return wordsFor(bits_); }

  // Mask of the valid bits of word `w` (the last word may be partial).
  uint64_t validMask(size_t w) const {
    size_t remaining = bits_ - w * kBitsPerWord;
    return remaining >= kBitsPerWord ? ~0ull : ((1ull << remaining) - 1);
  }

  bool isSet(size_t i) const {
    return (words_[i / kBitsPerWord].load(std::memory_order_relaxed) >> (i % kBitsPerWord)) & 1;
  }

  // Returns true if this call changed the bit from 0 to 1.
  bool trySet(size_t i) {
    uint64_t bit = 1ull << (i % kBitsPerWord);
    return !(words_[i / kBitsPerWord].fetch_or(bit, std::memory_order_acq_rel) & bit);
  }

  // Returns true if this call changed the bit from 1 to 0 (false means it was already clear).
  bool tryUnset(size_t i) {
    uint64_t bit = 1ull << (i % kBitsPerWord);
    return words_[i / kBitsPerWord].fetch_and(~bit, std::memory_order_acq_rel) & bit;
  }

  // Sets every valid bit of word `w`, returning the bits that were clear before (now claimed).
  uint64_t claimWord(size_t w) {
    uint64_t mask = validMask(w);
    return ~words_[w].fetch_or(mask, std::memory_order_acq_rel) & mask;
  }

  // Sets the bits of `mask` in word `w`, returning those of them that were clear before.
  uint64_t claimMask(size_t w, uint64_t mask) {
    return ~words_[w].fetch_or(mask, std::memory_order_acq_rel) & mask;
  }

  // Clears the bits of `mask` in word `w`, returning those of them that were set before.
  uint64_t unsetMask(size_t w, uint64_t mask) {
    return words_[w].fetch_and(~mask, std::memory_order_acq_rel) & mask;
  }

  uint64_t loadWord(size_t w) const { return words_[w].load(std::memory_order_acquire); }
  void storeWord(size_t w, uint64_t value) { words_[w].store(value, std::memory_order_release); }

  size_t popcount() const {
    size_t total = 0;
    for (size_t w = 0; w < words(); w++)
      total += static_cast<size_t>(__builtin_popcountll(loadWord(w)));
    return total;
  }

  void clearAll() {
    for (size_t w = 0; w < words(); w++) words_[w].store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>* words_;
  size_t bits_;
};

}  // namespace meshalloc

// The cache's key space: an open-addressing hash table, Redis's approximated LRU eviction and
// Redis's memory accounting (docs/handles-bench.md).
//
// A key is one object in the storage (malloc or handles), its payload: the key's and value's
// bytes. The index is one array of 16-byte slots (linear probing), each holding a payload's
// reference, its key's hash and its LRU clock: no allocation per key besides the payload.
// Probing, sampling for eviction and deleting read only the array, so with handles only the
// payload of a hash match is pinned (once per GET hit, once per SET to fill it). It is the
// index a C programmer would give a cache whose objects the allocator moves: one block that
// cannot fragment, holding references rather than pointers. (The first version chained
// 24-byte index nodes from malloc, like Redis's dictEntry: evicted at random, they left their
// spans sparse, 3-4 MiB beyond the accounted memory that neither meshing nor the defragmenter
// gave back; docs/handles-bench.md.)
//
// Eviction is Redis's allkeys-lru, not an exact LRU list: every slot carries a clock of
// one-second resolution, and each eviction samples a few keys from consecutive slots into a
// pool of the 16 idlest seen so far and evicts the idlest of the pool. The experiment compares
// this cache with Redis on Redis's workload, and which keys survive decides the fragmentation
// (an exact list evicts in insertion order, which frees whole spans and leaves nothing to
// compact); it also needs no list links.
//
// Memory accounting follows Redis's used_memory: the usable sizes (malloc_usable_size, or
// mh_usable_size for payloads with handles) of every payload plus the index array, so that
// every configuration evicts at the same logical size whatever its allocator rounds sizes to.
#ifndef HANDLE_CACHE_STORE_H
#define HANDLE_CACHE_STORE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <string_view>

#include "storage.h"

namespace handle_cache {

// Redis's LRU clock: seconds of the wall clock in 24 bits (LRU_CLOCK_RESOLUTION 1000 ms).
inline constexpr uint32_t kLruClockMax = (1u << 24) - 1;
inline constexpr size_t kEvictionPoolSize = 16;  // Redis's EVPOOL_SIZE
inline constexpr size_t kInitialSlots = 1024;
// The index grows past 3/4 full (linear probing's chains stay short: 2.5 slots read per hit,
// 8.5 per miss, on average) and shrinks under 1/10 full (Redis's HASHTABLE_MIN_FILL).
inline constexpr size_t kMaxLoadNumerator = 3;
inline constexpr size_t kMaxLoadDenominator = 4;
inline constexpr size_t kMinFillPercent = 10;

// A key's bytes, in the storage.
struct Payload {
  uint32_t keyLength;
  uint32_t valueLength;
  char bytes[];  // key, then value

  std::string_view key() const { return {bytes, keyLength}; }
  std::string_view value() const { return {bytes + keyLength, valueLength}; }
};

// A key's place in the index.
struct IndexSlot {
  Ref payload;  // 0: an empty slot
  uint32_t hash;
  uint32_t lru;  // the LRU clock when the key was last written or read
};
static_assert(sizeof(IndexSlot) == 16);

struct StoreStats {
  uint64_t evicted = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
};

inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint32_t hashKey(std::string_view key) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ key.size();
  size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    uint64_t word;
    memcpy(&word, key.data() + i, 8);
    h = mix64(h ^ word);
  }
  uint64_t tail = 0;
  memcpy(&tail, key.data() + i, key.size() - i);
  return static_cast<uint32_t>(mix64(h ^ tail));
}

template <typename Storage>
class Store {
  using View = Pinned<Storage, Payload>;
  static constexpr size_t kNone = ~size_t{0};

 public:
  explicit Store(uint64_t seed) : random_(seed) { resize(kInitialSlots); }

  size_t size() const { return count_; }
  // Redis's used_memory: what the allocator holds for the key space.
  size_t usedMemory() const { return entryBytes_ + tableBytes_; }
  size_t entryBytes() const { return entryBytes_; }
  size_t buckets() const { return mask_ + 1; }
  const StoreStats& stats() const { return stats_; }
  void setClock(uint32_t clock) { clock_ = clock & kLruClockMax; }

  // Appends the value of `key` to `out`; false when there is none.
  bool get(std::string_view key, std::string& out) {
    size_t at = find(key, [&](IndexSlot& slot, const Payload* payload) {
      slot.lru = clock_;
      out.append(payload->value());
    });
    (at != kNone ? stats_.hits : stats_.misses)++;
    return at != kNone;
  }

  // Stores key = value, replacing any earlier value. False when the allocator has no memory.
  bool set(std::string_view key, std::string_view value) {
    erase(key);
    if ((count_ + 1) * kMaxLoadDenominator > (mask_ + 1) * kMaxLoadNumerator) {
      resize(2 * (mask_ + 1));
      // No memory for a larger index: the old one takes keys up to 7/8 full.
      if ((count_ + 1) * 8 > (mask_ + 1) * 7) return false;
    }
    Ref payload = Storage::allocate(sizeof(Payload) + key.size() + value.size());
    if (payload == 0) return false;
    {
      View bytes(payload);
      bytes->keyLength = static_cast<uint32_t>(key.size());
      bytes->valueLength = static_cast<uint32_t>(value.size());
      memcpy(bytes->bytes, key.data(), key.size());
      memcpy(bytes->bytes + key.size(), value.data(), value.size());
    }
    uint32_t hash = hashKey(key);
    place({payload, hash, clock_});
    entryBytes_ += Storage::usable(payload);
    count_++;
    return true;
  }

  bool erase(std::string_view key) {
    size_t at = find(key, [](IndexSlot&, const Payload*) {});
    if (at == kNone) return false;
    remove(at);
    return true;
  }

  // Redis's allkeys-lru step (evict.c: evictionPoolPopulate, then the idlest of the pool).
  // False when there is nothing left to evict.
  bool evictOne(size_t samples) {
    if (count_ == 0) return false;
    // Every eviction samples afresh (the pool keeps the idlest seen so far). A sample may land
    // on empty slots only; a non-empty table gives a candidate soon.
    do {
      populatePool(samples);
    } while (pool_[0].payload == 0);
    size_t last = 0;
    while (last + 1 < kEvictionPoolSize && pool_[last + 1].payload != 0) last++;
    // The pool names keys by their payloads (unique while they live); the victim's slot is on
    // the probe sequence of its hash.
    size_t at = pool_[last].hash & mask_;
    while (table_[at].payload != pool_[last].payload) at = (at + 1) & mask_;
    remove(at);
    stats_.evicted++;
    return true;
  }

  // Frees every key and the table.
  void clear() {
    for (size_t i = 0; i <= mask_; i++) {
      if (table_[i].payload != 0) Storage::release(table_[i].payload);
    }
    free(table_);
    table_ = nullptr;
    count_ = entryBytes_ = tableBytes_ = 0;
  }

 private:
  struct Candidate {
    uint64_t idle;
    Ref payload;  // 0: an empty place in the pool
    uint32_t hash;
  };

  // The slot of `key` (kNone if there is none); `found` runs on the slot and its payload while
  // the payload is pinned. Only a hash match pins a payload.
  template <typename Found>
  size_t find(std::string_view key, Found found) {
    uint32_t hash = hashKey(key);
    for (size_t at = hash & mask_; table_[at].payload != 0; at = (at + 1) & mask_) {
      IndexSlot& slot = table_[at];
      if (slot.hash != hash) continue;
      View payload(slot.payload);
      if (payload->key() == key) {
        found(slot, payload.get());
        return at;
      }
    }
    return kNone;
  }

  // Puts an entry in the first empty slot of its probe sequence.
  void place(const IndexSlot& entry) {
    size_t at = entry.hash & mask_;
    while (table_[at].payload != 0) at = (at + 1) & mask_;
    table_[at] = entry;
  }

  // Frees the key in slot `at` and closes the gap (backward-shift deletion: no tombstones, so
  // probes stop at the first empty slot): each later entry of the run whose home slot is not
  // cyclically in (gap, its slot] moves back into the gap.
  void remove(size_t at) {
    Ref payload = table_[at].payload;
    forgetCandidate(payload);
    entryBytes_ -= Storage::usable(payload);
    count_--;
    Storage::release(payload);
    size_t gap = at;
    for (size_t next = (gap + 1) & mask_; table_[next].payload != 0; next = (next + 1) & mask_) {
      size_t home = table_[next].hash & mask_;
      if (((next - home) & mask_) >= ((next - gap) & mask_)) {
        table_[gap] = table_[next];
        gap = next;
      }
    }
    table_[gap] = {};
    if (mask_ + 1 > kInitialSlots && count_ * 100 < (mask_ + 1) * kMinFillPercent) {
      resize((mask_ + 1) / 2);
    }
  }

  // A new array of `slots` slots with every entry placed again; the old one is kept if there
  // is no memory for it (the caller sees the load it could not lower).
  void resize(size_t slots) {
    auto* table = static_cast<IndexSlot*>(calloc(slots, sizeof(IndexSlot)));
    if (table == nullptr) return;
    IndexSlot* old = table_;
    size_t oldSlots = old != nullptr ? mask_ + 1 : 0;
    table_ = table;
    mask_ = slots - 1;
    for (size_t i = 0; i < oldSlots; i++) {
      if (old[i].payload != 0) place(old[i]);
    }
    free(old);
    tableBytes_ = malloc_usable_size(table);
  }

  uint64_t idleSeconds(uint32_t lru) const {
    return clock_ >= lru ? clock_ - lru : clock_ + (kLruClockMax - lru);
  }

  // Redis's dictGetSomeKeys + evictionPoolPopulate: up to `samples` keys from consecutive
  // slots starting at a random one, each offered to the pool of the idlest.
  void populatePool(size_t samples) {
    size_t taken = 0, emptyRun = 0;
    size_t index = static_cast<size_t>(nextRandom()) & mask_;
    for (size_t steps = samples * 10; steps > 0 && taken < samples; steps--) {
      const IndexSlot& slot = table_[index];
      if (slot.payload == 0) {
        // Redis jumps elsewhere after a run of empty buckets as long as the sample size.
        if (++emptyRun >= samples) {
          index = static_cast<size_t>(nextRandom()) & mask_;
          emptyRun = 0;
          continue;
        }
      } else {
        emptyRun = 0;
        offerCandidate(idleSeconds(slot.lru), slot);
        taken++;
      }
      index = (index + 1) & mask_;
    }
  }

  // The pool (Redis's layout): the candidates sorted by idle time, idlest last, then the
  // empty places.
  void offerCandidate(uint64_t idle, const IndexSlot& slot) {
    for (const Candidate& candidate : pool_) {
      if (candidate.payload == slot.payload) return;  // sampled again: it keeps its place
    }
    size_t k = 0;
    while (k < kEvictionPoolSize && pool_[k].payload != 0 && pool_[k].idle < idle) k++;
    bool full = pool_[kEvictionPoolSize - 1].payload != 0;
    if (k == 0 && full) return;  // less idle than every candidate of a full pool
    if (!full) {
      memmove(&pool_[k + 1], &pool_[k], (kEvictionPoolSize - k - 1) * sizeof(Candidate));
    } else {
      k--;  // full: the least idle candidate leaves to make room
      memmove(&pool_[0], &pool_[1], k * sizeof(Candidate));
    }
    pool_[k] = {idle, slot.payload, slot.hash};
  }

  // A freed key leaves the pool at once: its reference may come back for another key.
  void forgetCandidate(Ref payload) {
    for (size_t i = 0; i < kEvictionPoolSize; i++) {
      if (pool_[i].payload != payload) continue;
      memmove(&pool_[i], &pool_[i + 1], (kEvictionPoolSize - i - 1) * sizeof(Candidate));
      pool_[kEvictionPoolSize - 1] = {};
      return;
    }
  }

  uint64_t nextRandom() { return mix64(random_ += 0x9e3779b97f4a7c15ULL); }

  IndexSlot* table_ = nullptr;
  size_t mask_ = 0;
  size_t count_ = 0;
  size_t entryBytes_ = 0;
  size_t tableBytes_ = 0;
  uint32_t clock_ = 0;
  uint64_t random_;
  Candidate pool_[kEvictionPoolSize] = {};
  StoreStats stats_;
};

}  // namespace handle_cache

#endif

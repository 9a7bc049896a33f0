// The cache's key space: a chained hash table of entries, Redis's approximated LRU eviction
// and Redis's memory accounting (docs/handles-bench.md).
//
// One entry is one object of the storage backend: a header, the key and the value. Chains
// link entries by Ref, so with handles every entry can be moved while it is not pinned; the
// bucket array itself is one plain malloc block (the defragmenter has nothing to gain from
// moving one large array).
//
// Eviction is Redis's allkeys-lru, not an exact LRU list: every entry carries a clock of
// one-second resolution, and each eviction samples a few keys from consecutive buckets into a
// pool of the 16 idlest seen so far and evicts the idlest of the pool. The experiment compares
// this cache with Redis on Redis's workload, and which keys survive decides the fragmentation
// (an exact list evicts in insertion order, which frees whole spans and leaves nothing to
// compact); it also needs no per-entry list links.
//
// Memory accounting follows Redis's used_memory: the usable size (malloc_usable_size or
// mh_usable_size) of every entry plus the bucket array, so that every configuration evicts at
// the same logical size whatever its allocator rounds sizes to.
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
inline constexpr size_t kInitialBuckets = 1024;

struct Entry {
  Ref next;  // the next entry of the bucket's chain
  uint32_t hash;
  uint32_t lru;  // the LRU clock when the entry was last written or read
  uint32_t keyLength;
  uint32_t valueLength;
  char bytes[];  // key, then value

  std::string_view key() const { return {bytes, keyLength}; }
  std::string_view value() const { return {bytes + keyLength, valueLength}; }
};

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
  using View = Pinned<Storage, Entry>;

 public:
  explicit Store(uint64_t seed) : random_(seed) { resize(kInitialBuckets); }

  size_t size() const { return count_; }
  // Redis's used_memory: what the allocator holds for the key space.
  size_t usedMemory() const { return entryBytes_ + tableBytes_; }
  size_t entryBytes() const { return entryBytes_; }
  size_t buckets() const { return mask_ + 1; }
  const StoreStats& stats() const { return stats_; }
  void setClock(uint32_t clock) { clock_ = clock & kLruClockMax; }

  // Appends the value of `key` to `out`; false when there is none.
  bool get(std::string_view key, std::string& out) {
    Ref ref = find(key, nullptr, [&](Entry* entry) {
      entry->lru = clock_;
      out.append(entry->value());
    });
    (ref != 0 ? stats_.hits : stats_.misses)++;
    return ref != 0;
  }

  // Stores key = value, replacing any earlier value. False when the allocator has no memory.
  bool set(std::string_view key, std::string_view value) {
    erase(key);
    size_t bytes = sizeof(Entry) + key.size() + value.size();
    Ref ref = Storage::allocate(bytes);
    if (ref == 0) return false;
    uint32_t hash = hashKey(key);
    Ref& bucket = table_[hash & mask_];
    {
      View entry(ref);
      entry->next = bucket;
      entry->hash = hash;
      entry->lru = clock_;
      entry->keyLength = static_cast<uint32_t>(key.size());
      entry->valueLength = static_cast<uint32_t>(value.size());
      memcpy(entry->bytes, key.data(), key.size());
      memcpy(entry->bytes + key.size(), value.data(), value.size());
    }
    bucket = ref;
    entryBytes_ += Storage::usable(ref);
    if (++count_ > mask_ + 1) resize(2 * (mask_ + 1));
    return true;
  }

  bool erase(std::string_view key) {
    Ref previous = 0;
    Ref ref = find(key, &previous);
    if (ref == 0) return false;
    unlink(ref, previous);
    return true;
  }

  // Redis's allkeys-lru step (evict.c: evictionPoolPopulate, then the idlest of the pool).
  // False when there is nothing left to evict.
  bool evictOne(size_t samples) {
    if (count_ == 0) return false;
    // Every eviction samples afresh (the pool keeps the idlest seen so far). A sample may land
    // on empty buckets only; a non-empty table gives a candidate soon.
    do {
      populatePool(samples);
    } while (pool_[0].ref == 0);
    size_t last = 0;
    while (last + 1 < kEvictionPoolSize && pool_[last + 1].ref != 0) last++;
    Ref victim = pool_[last].ref;
    uint32_t hash = View(victim)->hash;
    Ref previous = 0;
    for (Ref at = table_[hash & mask_]; at != victim; at = View(at)->next) previous = at;
    unlink(victim, previous);
    stats_.evicted++;
    return true;
  }

  // Frees every entry and the table.
  void clear() {
    for (size_t i = 0; i <= mask_; i++) {
      for (Ref ref = table_[i]; ref != 0;) {
        Ref next = View(ref)->next;
        Storage::release(ref);
        ref = next;
      }
    }
    free(table_);
    table_ = nullptr;
    count_ = entryBytes_ = tableBytes_ = 0;
  }

 private:
  struct Candidate {
    uint64_t idle;
    Ref ref;
  };

  // The entry of `key` (0 if none), and in *previous the entry before it in its chain (0 when
  // it is the first); `found` runs on the entry while the lookup still holds its pin. A link
  // inside an entry is read only while that entry is pinned.
  template <typename Found = void (*)(Entry*)>
  Ref find(
      std::string_view key, Ref* previous, Found found = [](Entry*) {}) {
    uint32_t hash = hashKey(key);
    Ref before = 0;
    for (Ref ref = table_[hash & mask_]; ref != 0;) {
      Ref next;
      {
        View entry(ref);
        if (entry->hash == hash && entry->key() == key) {
          if (previous != nullptr) *previous = before;
          found(entry.get());
          return ref;
        }
        next = entry->next;
      }
      before = ref;
      ref = next;
    }
    return 0;
  }

  void unlink(Ref ref, Ref previous) {
    Ref next;
    uint32_t hash;
    {
      View entry(ref);
      next = entry->next;
      hash = entry->hash;
    }
    if (previous == 0) {
      table_[hash & mask_] = next;
    } else {
      View(previous)->next = next;
    }
    forgetCandidate(ref);
    entryBytes_ -= Storage::usable(ref);
    count_--;
    Storage::release(ref);
  }

  void resize(size_t buckets) {
    Ref* table = static_cast<Ref*>(calloc(buckets, sizeof(Ref)));
    if (table == nullptr) return;  // keep the old table: longer chains, still correct
    size_t mask = buckets - 1;
    for (size_t i = 0; table_ != nullptr && i <= mask_; i++) {
      for (Ref ref = table_[i]; ref != 0;) {
        View entry(ref);
        Ref next = entry->next;
        entry->next = table[entry->hash & mask];
        table[entry->hash & mask] = ref;
        ref = next;
      }
    }
    free(table_);
    table_ = table;
    mask_ = mask;
    tableBytes_ = malloc_usable_size(table);
  }

  uint64_t idleSeconds(uint32_t lru) const {
    return clock_ >= lru ? clock_ - lru : clock_ + (kLruClockMax - lru);
  }

  // Redis's dictGetSomeKeys + evictionPoolPopulate: up to `samples` entries from consecutive
  // buckets starting at a random one, each offered to the pool of the idlest.
  void populatePool(size_t samples) {
    size_t taken = 0, emptyRun = 0;
    size_t index = static_cast<size_t>(nextRandom()) & mask_;
    for (size_t steps = samples * 10; steps > 0 && taken < samples; steps--) {
      Ref ref = table_[index];
      if (ref == 0) {
        // Redis jumps elsewhere after a run of empty buckets as long as the sample size.
        if (++emptyRun >= samples) {
          index = static_cast<size_t>(nextRandom()) & mask_;
          emptyRun = 0;
          continue;
        }
      } else {
        emptyRun = 0;
      }
      while (ref != 0 && taken < samples) {
        View entry(ref);
        offerCandidate(idleSeconds(entry->lru), ref);
        taken++;
        ref = entry->next;
      }
      index = (index + 1) & mask_;
    }
  }

  // The pool (Redis's layout): the candidates sorted by idle time, idlest last, then the
  // empty slots (ref 0).
  void offerCandidate(uint64_t idle, Ref ref) {
    for (const Candidate& candidate : pool_) {
      if (candidate.ref == ref) return;  // sampled again: it keeps its place
    }
    size_t k = 0;
    while (k < kEvictionPoolSize && pool_[k].ref != 0 && pool_[k].idle < idle) k++;
    bool full = pool_[kEvictionPoolSize - 1].ref != 0;
    if (k == 0 && full) return;  // less idle than every candidate of a full pool
    if (!full) {
      memmove(&pool_[k + 1], &pool_[k], (kEvictionPoolSize - k - 1) * sizeof(Candidate));
    } else {
      k--;  // full: the least idle candidate leaves to make room
      memmove(&pool_[0], &pool_[1], k * sizeof(Candidate));
    }
    pool_[k] = {idle, ref};
  }

  // A freed entry leaves the pool at once: a freed handle may not be used again, and a freed
  // pointer may come back for another entry.
  void forgetCandidate(Ref ref) {
    for (size_t i = 0; i < kEvictionPoolSize; i++) {
      if (pool_[i].ref != ref) continue;
      memmove(&pool_[i], &pool_[i + 1], (kEvictionPoolSize - i - 1) * sizeof(Candidate));
      pool_[kEvictionPoolSize - 1] = {0, 0};
      return;
    }
  }

  uint64_t nextRandom() { return mix64(random_ += 0x9e3779b97f4a7c15ULL); }

  Ref* table_ = nullptr;
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

// The cache's key space: a chained hash table, Redis's approximated LRU eviction and Redis's
// memory accounting (docs/handles-bench.md).
//
// A key has two objects: an index node (chain link, hash, LRU clock, the reference to its
// payload) in plain malloc memory, and its payload (the key's and value's bytes) in the
// storage, malloc or handles. Walking a chain, sampling for eviction and unlinking read only
// nodes, so with handles only the payload of a hash match is pinned (once per GET hit, once
// per SET to fill it), and the payloads -- 90 % of the bytes here -- are what the
// defragmenter moves. The nodes stay put, like Redis's dictEntry, as an index of raw pointers
// would in any handle-based program; under meshalloc, meshing compacts them.
//
// Eviction is Redis's allkeys-lru, not an exact LRU list: every node carries a clock of
// one-second resolution, and each eviction samples a few keys from consecutive buckets into a
// pool of the 16 idlest seen so far and evicts the idlest of the pool. The experiment compares
// this cache with Redis on Redis's workload, and which keys survive decides the fragmentation
// (an exact list evicts in insertion order, which frees whole spans and leaves nothing to
// compact); it also needs no list links.
//
// Memory accounting follows Redis's used_memory: the usable sizes (malloc_usable_size, or
// mh_usable_size for payloads with handles) of every node and payload plus the bucket array,
// so that every configuration evicts at the same logical size whatever its allocator rounds
// sizes to.
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

// A key's bytes, in the storage.
struct Payload {
  uint32_t keyLength;
  uint32_t valueLength;
  char bytes[];  // key, then value

  std::string_view key() const { return {bytes, keyLength}; }
  std::string_view value() const { return {bytes + keyLength, valueLength}; }
};

// A key's place in the index, in malloc memory.
struct Node {
  Node* next;  // the next node of the bucket's chain
  uint32_t hash;
  uint32_t lru;  // the LRU clock when the key was last written or read
  Ref payload;
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
  using View = Pinned<Storage, Payload>;

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
    Node** link = find(key, [&](Node* node, const Payload* payload) {
      node->lru = clock_;
      out.append(payload->value());
    });
    (link != nullptr ? stats_.hits : stats_.misses)++;
    return link != nullptr;
  }

  // Stores key = value, replacing any earlier value. False when the allocator has no memory.
  bool set(std::string_view key, std::string_view value) {
    erase(key);
    Ref payload = Storage::allocate(sizeof(Payload) + key.size() + value.size());
    if (payload == 0) return false;
    Node* node = static_cast<Node*>(malloc(sizeof(Node)));
    if (node == nullptr) {
      Storage::release(payload);
      return false;
    }
    {
      View bytes(payload);
      bytes->keyLength = static_cast<uint32_t>(key.size());
      bytes->valueLength = static_cast<uint32_t>(value.size());
      memcpy(bytes->bytes, key.data(), key.size());
      memcpy(bytes->bytes + key.size(), value.data(), value.size());
    }
    uint32_t hash = hashKey(key);
    Node*& bucket = table_[hash & mask_];
    *node = {bucket, hash, clock_, payload};
    bucket = node;
    entryBytes_ += bytesOf(node);
    if (++count_ > mask_ + 1) resize(2 * (mask_ + 1));
    return true;
  }

  bool erase(std::string_view key) {
    Node** link = find(key, [](Node*, const Payload*) {});
    if (link == nullptr) return false;
    unlink(link);
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
    } while (pool_[0].node == nullptr);
    size_t last = 0;
    while (last + 1 < kEvictionPoolSize && pool_[last + 1].node != nullptr) last++;
    Node* victim = pool_[last].node;
    Node** link = &table_[victim->hash & mask_];
    while (*link != victim) link = &(*link)->next;
    unlink(link);
    stats_.evicted++;
    return true;
  }

  // Frees every key and the table.
  void clear() {
    for (size_t i = 0; i <= mask_; i++) {
      for (Node* node = table_[i]; node != nullptr;) {
        Node* next = node->next;
        Storage::release(node->payload);
        free(node);
        node = next;
      }
    }
    free(table_);
    table_ = nullptr;
    count_ = entryBytes_ = tableBytes_ = 0;
  }

 private:
  struct Candidate {
    uint64_t idle;
    Node* node;
  };

  size_t bytesOf(Node* node) const {
    return malloc_usable_size(node) + Storage::usable(node->payload);
  }

  // Where the link to the node of `key` is (nullptr if there is none); `found` runs on the
  // node and its payload while the payload is pinned. Only a hash match pins a payload.
  template <typename Found>
  Node** find(std::string_view key, Found found) {
    uint32_t hash = hashKey(key);
    for (Node** link = &table_[hash & mask_]; *link != nullptr; link = &(*link)->next) {
      Node* node = *link;
      if (node->hash != hash) continue;
      View payload(node->payload);
      if (payload->key() == key) {
        found(node, payload.get());
        return link;
      }
    }
    return nullptr;
  }

  void unlink(Node** link) {
    Node* node = *link;
    *link = node->next;
    forgetCandidate(node);
    entryBytes_ -= bytesOf(node);
    count_--;
    Storage::release(node->payload);
    free(node);
  }

  void resize(size_t buckets) {
    Node** table = static_cast<Node**>(calloc(buckets, sizeof(Node*)));
    if (table == nullptr) return;  // keep the old table: longer chains, still correct
    size_t mask = buckets - 1;
    for (size_t i = 0; table_ != nullptr && i <= mask_; i++) {
      for (Node* node = table_[i]; node != nullptr;) {
        Node* next = node->next;
        node->next = table[node->hash & mask];
        table[node->hash & mask] = node;
        node = next;
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

  // Redis's dictGetSomeKeys + evictionPoolPopulate: up to `samples` keys from consecutive
  // buckets starting at a random one, each offered to the pool of the idlest.
  void populatePool(size_t samples) {
    size_t taken = 0, emptyRun = 0;
    size_t index = static_cast<size_t>(nextRandom()) & mask_;
    for (size_t steps = samples * 10; steps > 0 && taken < samples; steps--) {
      Node* node = table_[index];
      if (node == nullptr) {
        // Redis jumps elsewhere after a run of empty buckets as long as the sample size.
        if (++emptyRun >= samples) {
          index = static_cast<size_t>(nextRandom()) & mask_;
          emptyRun = 0;
          continue;
        }
      } else {
        emptyRun = 0;
      }
      for (; node != nullptr && taken < samples; node = node->next, taken++) {
        offerCandidate(idleSeconds(node->lru), node);
      }
      index = (index + 1) & mask_;
    }
  }

  // The pool (Redis's layout): the candidates sorted by idle time, idlest last, then the
  // empty slots.
  void offerCandidate(uint64_t idle, Node* node) {
    for (const Candidate& candidate : pool_) {
      if (candidate.node == node) return;  // sampled again: it keeps its place
    }
    size_t k = 0;
    while (k < kEvictionPoolSize && pool_[k].node != nullptr && pool_[k].idle < idle) k++;
    bool full = pool_[kEvictionPoolSize - 1].node != nullptr;
    if (k == 0 && full) return;  // less idle than every candidate of a full pool
    if (!full) {
      memmove(&pool_[k + 1], &pool_[k], (kEvictionPoolSize - k - 1) * sizeof(Candidate));
    } else {
      k--;  // full: the least idle candidate leaves to make room
      memmove(&pool_[0], &pool_[1], k * sizeof(Candidate));
    }
    pool_[k] = {idle, node};
  }

  // A freed key leaves the pool at once: its node's memory may come back for another key.
  void forgetCandidate(Node* node) {
    for (size_t i = 0; i < kEvictionPoolSize; i++) {
      if (pool_[i].node != node) continue;
      memmove(&pool_[i], &pool_[i + 1], (kEvictionPoolSize - i - 1) * sizeof(Candidate));
      pool_[kEvictionPoolSize - 1] = {0, nullptr};
      return;
    }
  }

  uint64_t nextRandom() { return mix64(random_ += 0x9e3779b97f4a7c15ULL); }

  Node** table_ = nullptr;
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

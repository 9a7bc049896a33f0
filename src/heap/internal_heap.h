// The allocator's own heap for metadata (span records, thread heaps, arena bookkeeping). It never
// calls malloc, and freed blocks are reused only for blocks of the same size, so metadata stays
// type-stable: a stale pointer read by a racing free never lands in unrelated data.
#pragma once

#include <cstddef>

#include "heap/fork.h"
#include "support/lock.h"

namespace meshalloc {

class InternalHeap {
 public:
  static constexpr size_t kGranule = 64;  // one cache line: metadata never shares a line
  static constexpr size_t kMaxPooledSize = 4096;
  // Chunks start small and double up to kChunkSize, so that a small program's metadata
  // mapping is sized by what it uses rather than by a large heap's needs.
  static constexpr size_t kFirstChunkSize = 64 << 10;
  static constexpr size_t kChunkSize = 1 << 20;

  // Zero-filled storage of at least `bytes`; nullptr if the OS refuses memory.
  static void* allocate(size_t bytes);
  // `bytes` must be the size passed to allocate().
  static void free(void* block, size_t bytes);
  static size_t bytesMapped();
  // Mapped bytes less the part of the current chunk never handed out (fresh mmap memory that
  // was never touched, so not resident). For statistics.
  static size_t bytesTouched();

  // Its lock, for fork (heap/fork.cc).
  static const heap::ForkParticipant& forkParticipant();

 private:
  struct FreeBlock {
    FreeBlock* next;
  };
  static constexpr size_t kPools = kMaxPooledSize / kGranule;

  static inline Mutex lock_{LockRank::kInternalHeap};
  static inline FreeBlock* pools_[kPools] = {};
  static inline char* bump_ = nullptr;
  static inline char* bumpEnd_ = nullptr;
  static inline size_t mapped_ = 0;
  static inline size_t nextChunkSize_ = kFirstChunkSize;
};

}  // namespace meshalloc

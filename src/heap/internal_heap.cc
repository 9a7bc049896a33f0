#include "heap/internal_heap.h"

#include <cstring>

#include "platform/os.h"

namespace meshalloc {

namespace {
size_t roundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

void* InternalHeap::allocate(size_t bytes) {
  size_t rounded = roundUp(bytes ? bytes : 1, kGranule);
  if (rounded > kMaxPooledSize) {
    size_t mapped = roundUp(rounded, os::pageSize());
    void* block = os::mapMetadata(mapped);
    if (block) {
      LockGuard guard(lock_);
      mapped_ += mapped;
    }
    return block;
  }
  size_t pool = rounded / kGranule - 1;
  LockGuard guard(lock_);
  if (FreeBlock* block = pools_[pool]) {
    pools_[pool] = block->next;
    memset(block, 0, rounded);
    return block;
  }
  if (static_cast<size_t>(bumpEnd_ - bump_) < rounded) {
    size_t chunkSize = nextChunkSize_;
    char* chunk = static_cast<char*>(os::mapMetadata(chunkSize));
    if (!chunk) return nullptr;
    mapped_ += chunkSize;
    if (nextChunkSize_ < kChunkSize) nextChunkSize_ *= 2;
    bump_ = chunk;  // the tail of the previous chunk is abandoned: at most kMaxPooledSize
    bumpEnd_ = chunk + chunkSize;
  }
  void* block = bump_;
  bump_ += rounded;
  return block;  // fresh mmap memory is already zero
}

void InternalHeap::free(void* block, size_t bytes) {
  if (!block) return;
  size_t rounded = roundUp(bytes ? bytes : 1, kGranule);
  if (rounded > kMaxPooledSize) {
    size_t mapped = roundUp(rounded, os::pageSize());
    os::unmap(block, mapped);
    LockGuard guard(lock_);
    mapped_ -= mapped;
    return;
  }
  size_t pool = rounded / kGranule - 1;
  LockGuard guard(lock_);
  FreeBlock* freed = static_cast<FreeBlock*>(block);
  freed->next = pools_[pool];
  pools_[pool] = freed;
}

size_t InternalHeap::bytesTouched() {
  LockGuard guard(lock_);
  return mapped_ - static_cast<size_t>(bumpEnd_ - bump_);
}

const heap::ForkParticipant& InternalHeap::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant =
      heap::mutexForkParticipant<lock_>("internal heap", heap::ForkRank::kInternalHeap);
  return kParticipant;
}

size_t InternalHeap::bytesMapped() {
  LockGuard guard(lock_);
  return mapped_;
}

}  // namespace meshalloc

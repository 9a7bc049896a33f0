#include "mesh/span_backing.h"

#include <new>

#include "heap/arena.h"
#include "heap/internal_heap.h"
#include "mesh/page_mask.h"
#include "platform/os.h"

namespace meshalloc {

namespace {
// The file is grown in steps this large (a memfd's size costs nothing until pages are written).
constexpr size_t kFileGrowthBytes = size_t{256} << 20;
constexpr char kFileName[] = "meshalloc-meshed-spans";

// Only the pages holding live objects are copied into the file: the others stay holes, which
// cost no memory until a slot there is handed out and written. The copy goes through pwrite,
// not through the new mapping, because the span is write-protected while it moves.
bool writeLivePages(int fd, size_t offset, Span* span, const PageMask& live) {
  size_t pageSize = Arena::pageSize();
  bool written = true;
  forEachRun(live, span->spanPages, true, [&](size_t first, size_t count) {
    if (written) {
      written = os::writeToFile(fd, offset + first * pageSize,
                                reinterpret_cast<void*>(span->spanStart + first * pageSize),
                                count * pageSize);
    }
  });
  return written;
}

MeshInfo* newMeshInfo(uint32_t capacity) {
  void* block = InternalHeap::allocate(MeshInfo::bytesFor(capacity));
  if (!block) return nullptr;
  MeshInfo* info = new (block) MeshInfo();
  info->aliasCapacity = static_cast<uint8_t>(capacity);
  return info;
}

void freeMeshInfo(MeshInfo* info) {
  InternalHeap::free(info, MeshInfo::bytesFor(info->aliasCapacity));
}

// File mappings fill in lazily. Reading each written page through the span's own mapping maps
// it now, so every page of the file is mapped somewhere and the process's PSS counts it (a
// file page no mapping has touched is missing from PSS). MAP_POPULATE cannot do this: on a
// memory file it allocates a page for every hole. Aliases stay lazy; their first touch maps
// the pages that exist.
void mapLivePages(uintptr_t start, size_t pages, const PageMask& live) {
  size_t pageSize = Arena::pageSize();
  for (size_t page = 0; page < pages; page++) {
    if (live.has(page)) (void)*reinterpret_cast<volatile const char*>(start + page * pageSize);
  }
}
}  // namespace

bool SpanBacking::ensureFile() {
  if (fd_ >= 0) return true;
  fd_ = os::createSharedFile(kFileName);
  return fd_ >= 0;
}

bool SpanBacking::allocateFileRange(size_t bytes, size_t* offset) {
  for (FreeRange* range = freeRanges_.front(); range; range = freeRanges_.next(range)) {
    if (range->bytes < bytes) continue;
    *offset = range->offset;
    if (range->bytes == bytes) {
      freeRanges_.remove(range);
      InternalHeap::free(range, sizeof(FreeRange));
    } else {
      range->offset += bytes;
      range->bytes -= bytes;
    }
    return true;
  }
  if (!ensureFile()) return false;
  if (fileEnd_ + bytes > fileSize_) {
    size_t newSize = fileSize_ + (bytes > kFileGrowthBytes ? bytes : kFileGrowthBytes);
    if (!os::resizeFile(fd_, newSize)) return false;
    fileSize_ = newSize;
  }
  *offset = fileEnd_;
  fileEnd_ += bytes;
  return true;
}

void SpanBacking::freeFileRangeLocked(size_t offset, size_t bytes, bool punch) {
  if (punch) os::punchHole(fd_, offset, bytes);
  if (offset + bytes == fileEnd_) {
    fileEnd_ = offset;
    return;
  }
  FreeRange* range = static_cast<FreeRange*>(InternalHeap::allocate(sizeof(FreeRange)));
  if (!range) return;  // the hole stays punched; only the file offset is lost
  new (range) FreeRange();
  range->offset = offset;
  range->bytes = bytes;
  freeRanges_.pushFront(range);
}

bool SpanBacking::share(Span* span) {
  if (span->mesh) return true;
  size_t bytes = span->spanBytes(Arena::pageSize());
  MeshInfo* info = newMeshInfo(MeshInfo::kInitialAliases);
  if (!info) return false;
  LockGuard guard(lock_);
  size_t offset;
  if (!allocateFileRange(bytes, &offset)) {
    freeMeshInfo(info);
    return false;
  }
  void* start = reinterpret_cast<void*>(span->spanStart);
  // The span is write-protected by the caller, so its content cannot change under the copy, and
  // no slot is handed out while it is a mesh candidate, so no page becomes live meanwhile.
  PageMask live = livePages(span, Arena::pageSize());
  if (injectedFailure() || !writeLivePages(fd_, offset, span, live) ||
      !os::mapFileFixed(start, bytes, fd_, offset)) {
    freeFileRangeLocked(offset, bytes);
    freeMeshInfo(info);
    return false;
  }
  mapLivePages(span->spanStart, span->spanPages, live);
  info->owner = span;
  info->fileOffset = offset;
  info->aliasCount = 0;
  span->mesh = info;
  shared_.pushBack(info);
  stats_.meshedSpans++;
  stats_.fileBytes += bytes;
  return true;
}

bool SpanBacking::reserveAliasesLocked(Span* span, uint32_t aliases) {
  MeshInfo* info = span->mesh;
  if (aliases > MeshInfo::kMaxAliases) return false;
  if (aliases <= info->aliasCapacity) return true;
  MeshInfo* grown = newMeshInfo(MeshInfo::kMaxAliases);
  if (!grown) return false;
  grown->owner = info->owner;
  grown->fileOffset = info->fileOffset;
  grown->aliasCount = info->aliasCount;
  grown->pagesReleased = info->pagesReleased;
  for (uint32_t i = 0; i < info->aliasCount; i++) grown->aliases()[i] = info->aliases()[i];
  // Only the mesher changes a live span's record, under this lock; fork walks the list under it
  // too, and everyone else only tests span->mesh against null. In before out, so that the list
  // never looks empty (anyShared reads it without the lock).
  shared_.pushBack(grown);
  shared_.remove(info);
  span->mesh = grown;
  freeMeshInfo(info);
  return true;
}

bool SpanBacking::addAlias(Span* span, uintptr_t alias) {
  if (!span->mesh) return false;
  size_t bytes = span->spanBytes(Arena::pageSize());
  LockGuard guard(lock_);
  if (!reserveAliasesLocked(span, span->mesh->aliasCount + 1)) return false;
  MeshInfo* info = span->mesh;
  if (injectedFailure() ||
      !os::mapFileFixed(reinterpret_cast<void*>(alias), bytes, fd_, info->fileOffset)) {
    return false;
  }
  info->aliases()[info->aliasCount++] = alias;
  stats_.aliasSpans++;
  stats_.releasedBytes += bytes;
  if (stats_.releasedBytes > stats_.releasedBytesPeak)
    stats_.releasedBytesPeak = stats_.releasedBytes;
  return true;
}

bool SpanBacking::absorb(Span* span, Span* source, bool* stranded) {
  *stranded = false;
  MeshInfo* absorbed = source->mesh;
  if (!span->mesh || !absorbed) return false;
  uintptr_t starts[kMaxVirtualSpans];
  uint32_t views = 0;
  forEachVirtualSpan(source, [&](uintptr_t start) { starts[views++] = start; });
  size_t bytes = span->spanBytes(Arena::pageSize());
  LockGuard guard(lock_);
  if (!reserveAliasesLocked(span, span->mesh->aliasCount + views)) return false;
  MeshInfo* info = span->mesh;
  // Read-only until all have moved: a write through one already moved would otherwise land in
  // the copy, and be lost if a later move fails and it has to go back.
  for (uint32_t i = 0; i < views; i++) {
    if (injectedFailure() || !os::mapFileFixed(reinterpret_cast<void*>(starts[i]), bytes, fd_,
                                               info->fileOffset, false)) {
      for (uint32_t j = 0; j < i; j++) {
        if (!os::mapFileFixed(reinterpret_cast<void*>(starts[j]), bytes, fd_, absorbed->fileOffset,
                              false)) {
          *stranded = true;
        }
      }
      return false;
    }
  }
  for (uint32_t i = 0; i < views; i++) info->aliases()[info->aliasCount++] = starts[i];
  // Nothing maps source's pages any more: they go back now, its record once the page map no
  // longer needs it (forgetAbsorbed). Off the shared list at once, so that fork never sees it.
  freeFileRangeLocked(absorbed->fileOffset, bytes);
  shared_.remove(absorbed);
  stats_.meshedSpans--;
  stats_.fileBytes -= bytes;
  stats_.aliasSpans++;  // source's own span; its aliases only changed owner
  stats_.releasedBytes += bytes;
  if (stats_.releasedBytes > stats_.releasedBytesPeak)
    stats_.releasedBytesPeak = stats_.releasedBytes;
  return true;
}

void SpanBacking::forgetAbsorbed(Span* source) {
  MeshInfo* info = source->mesh;
  if (!info) return;
  source->mesh = nullptr;
  freeMeshInfo(info);
}

void SpanBacking::restore(Span* span) {
  MeshInfo* info = span->mesh;
  if (!info) return;
  size_t pages = span->spanPages;
  size_t bytes = span->spanBytes(Arena::pageSize());
  // A fresh private mapping holds no pages: each virtual span goes back to the arena's clean
  // runs with no decommit call. One that cannot be made private again still shows the file
  // range, which is reused, so it is never handed out again.
  auto makePrivate = [&](uintptr_t start) {
    if (os::mapAnonymousFixed(reinterpret_cast<void*>(start), bytes))
      Arena::releaseRemapped(start, pages);
    else
      Arena::abandon(start, pages);
  };
  {
    LockGuard guard(lock_);
    for (uint32_t i = 0; i < info->aliasCount; i++) makePrivate(info->aliases()[i]);
    stats_.aliasSpans -= info->aliasCount;
    stats_.releasedBytes -= static_cast<size_t>(info->aliasCount) * bytes;
    makePrivate(span->spanStart);
    freeFileRangeLocked(info->fileOffset, bytes, !info->pagesReleased);
    shared_.remove(info);
    stats_.meshedSpans--;
    stats_.fileBytes -= bytes;
  }
  span->mesh = nullptr;
  freeMeshInfo(info);
}

// Without lock_: the range stays this span's until restore() frees it, and the mesher holds
// lock_ across its mapping calls, which the freeing thread must not wait for.
void SpanBacking::releasePages(Span* span) {
  MeshInfo* info = span->mesh;
  if (!info || info->pagesReleased) return;
  os::punchHole(fd_, info->fileOffset, span->spanBytes(Arena::pageSize()));
  info->pagesReleased = true;
}

const heap::ForkParticipant& SpanBacking::forkParticipant() {
  // Between the global heap's locks and the arena's: the internal heap's lock is taken inside it.
  static constexpr heap::ForkParticipant kParticipant =
      heap::mutexForkParticipant<lock_>("span backing", heap::ForkRank::kSpanBacking);
  return kParticipant;
}

SpanBackingStats SpanBacking::stats() {
  LockGuard guard(lock_);
  return stats_;
}

bool SpanBacking::anyShared() {
  return !shared_.empty();
}

// With lock_ held (fork): every virtual span of every shared span, primary and aliases.
void SpanBacking::setProtectionOfAll(bool (*protect)(void*, size_t)) {
  size_t pageSize = Arena::pageSize();
  for (MeshInfo* info = shared_.front(); info; info = shared_.next(info)) {
    size_t bytes = info->owner->spanBytes(pageSize);
    forEachVirtualSpan(info->owner,
                       [&](uintptr_t start) { protect(reinterpret_cast<void*>(start), bytes); });
  }
}

void SpanBacking::protectAllForFork() {
  setProtectionOfAll(os::protectReadOnly);
}

void SpanBacking::unprotectAllAfterFork() {
  setProtectionOfAll(os::protectReadWrite);
}

// In the child, single-threaded, with lock_ held by the fork. Every shared span gets the same
// offset in a new file, so the MeshInfo records stay valid; aliases are remapped onto it.
void SpanBacking::copyToPrivateFileInChild() {
  if (fd_ < 0) return;
  int childFd = os::createSharedFile(kFileName);
  if (childFd < 0 || !os::resizeFile(childFd, fileSize_)) {
    // Without a file of its own the child keeps sharing the meshed pages with its parent;
    // say so rather than diverge silently.
    static const char kMessage[] =
        "meshalloc: fork: cannot copy meshed spans; child shares them with its parent\n";
    os::writeStderr(kMessage, sizeof(kMessage) - 1);
    return;
  }
  size_t pageSize = Arena::pageSize();
  for (MeshInfo* info = shared_.front(); info; info = shared_.next(info)) {
    Span* span = info->owner;
    size_t bytes = span->spanBytes(pageSize);
    PageMask live = livePages(span, pageSize);
    writeLivePages(childFd, info->fileOffset, span, live);
    os::mapFileFixed(reinterpret_cast<void*>(span->spanStart), bytes, childFd, info->fileOffset);
    mapLivePages(span->spanStart, span->spanPages, live);
    for (uint32_t i = 0; i < info->aliasCount; i++) {
      os::mapFileFixed(reinterpret_cast<void*>(info->aliases()[i]), bytes, childFd,
                       info->fileOffset);
    }
  }
  os::closeFd(fd_);
  fd_ = childFd;
}

}  // namespace meshalloc

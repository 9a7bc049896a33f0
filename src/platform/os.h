// Every operating-system call the allocator makes goes through this file, so that the layers
// above stay portable and so that no call here can re-enter malloc.
#pragma once

#include <cstddef>
#include <cstdint>

struct sigaction;

namespace meshalloc::os {

// Page size, read once from the system at start-up (never assumed to be 4 KiB).
size_t pageSize();
size_t pageShift();
void initPlatform();

// Reserves `bytes` of private, zero-filled address space aligned to `alignment` (a power of two
// that is a multiple of the page size). Pages are backed lazily; nothing is charged until touched.
// Returns nullptr if the address space cannot be had.
void* reserveAligned(size_t bytes, size_t alignment);
void unmap(void* addr, size_t bytes);
// Gives the physical pages behind [addr, addr+bytes) back to the OS; the range stays mapped and
// reads as zeros afterwards.
void decommit(void* addr, size_t bytes);
// The same for private memory whose contents no longer matter, without decommit's fallbacks
// (which map over the range or clear it): false, with the pages left as they were, if the
// kernel refuses.
bool dropPages(void* addr, size_t bytes);
// Anonymous memory for the allocator's own metadata.
void* mapMetadata(size_t bytes);

// --- Shared physical memory for meshing (see docs/meshing.md) ---
// An anonymous, growable in-memory file (memfd); -1 on failure.
int createSharedFile(const char* name);
bool resizeFile(int fd, size_t bytes);
// Drops the file's pages in [offset, offset+bytes): the physical memory goes back to the OS.
bool punchHole(int fd, size_t offset, size_t bytes);
// Copies `bytes` from `source` into the file at `offset` (pwrite, retried on short writes).
bool writeToFile(int fd, size_t offset, const void* source, size_t bytes);
// Maps file range [offset, offset+bytes) shared at exactly `addr` (read-write, or read-only
// if not `writable`), replacing what was there in one step. Pages are mapped on first touch.
// False (mapping untouched) on failure.
bool mapFileFixed(void* addr, size_t bytes, int fd, size_t offset, bool writable = true);
// Replaces [addr, addr+bytes) with fresh private zero pages in one step.
bool mapAnonymousFixed(void* addr, size_t bytes);
bool protectReadOnly(void* addr, size_t bytes);
bool protectReadWrite(void* addr, size_t bytes);
// Makes a readable range writable without mprotect, for when protectReadWrite failed: a private
// anonymous copy of its contents is moved over it in one mremap (other threads' page faults wait
// on the mapping lock meanwhile, so none sees the range missing). Whatever was mapped there, a
// shared file range included, is replaced: the range no longer shares pages with anything.
bool replaceWithWritableCopy(void* addr, size_t bytes);
void closeFd(int fd);

// --- Files the api layer writes (the statistics report, the live statistics file) ---
enum class FileCreation {
  kReplace,           // created or truncated, mode 0644 (a report the user asked for)
  kExclusivePrivate,  // created only if absent, never through a symbolic link, mode 0600
};
// A descriptor open for writing (close-on-exec), or -1 with errno set.
int createFile(const char* path, FileCreation how);
bool renameFile(const char* from, const char* to);
void removeFile(const char* path);
// A duplicate of `fd` numbered `lowest` or above (close-on-exec), or -1.
int duplicateFd(int fd, int lowest);
long processId();
// Wall-clock time (CLOCK_REALTIME) in milliseconds since the epoch.
uint64_t realtimeMillis();
// Lines of /proc/self/maps (the kernel's mapping count); -1 if unreadable.
long countMappings();
// The value of the line starting with `field` (e.g. "VmPTE:" in /proc/self/status, "Pss:" in
// /proc/self/smaps_rollup), which the kernel gives in kB, in bytes; -1 if the file cannot be
// read or has no such line. Reads through a stack buffer: no allocation.
long long readProcKibField(const char* path, const char* field);
// Bytes of the pages of [addr, addr+bytes) that are resident now (mincore); 0 if it cannot
// tell. `addr` must be page-aligned. Never allocates.
size_t residentBytes(const void* addr, size_t bytes);
// A pipe whose ends do not survive exec; false on failure.
bool makePipe(int fds[2]);
// Blocking single-byte write/read that retry on EINTR.
void signalByte(int fd);
bool awaitByte(int fd);

// membarrier(2), private expedited: register once; then membarrierAllThreads() makes every
// running thread of the process execute a full memory barrier. False if unsupported, or (for
// membarrierAllThreads) if the call failed: a seccomp filter installed after start-up can
// forbid it.
bool registerMembarrier();
bool membarrierAllThreads();
// The same effect without membarrier, for when it stopped working: downgrading the protection
// of a page this thread has just written makes the kernel shoot its translation down on every
// CPU running this process, and the interrupt executes a full barrier there (threads not running
// have been switched out, which is one too). On x86-64 shootdowns are interrupts; where TLB
// invalidation is broadcast in hardware (AArch64) remote threads are not interrupted, and this
// returns false. Tens of microseconds; false also if the page could not be set up.
bool interruptRunningThreads();
// Tests only: makes membarrierAllThreads fail from now on (as a seccomp filter would).
void failMembarrierForTesting();

uint64_t monotonicNanos();
uint64_t threadCpuNanos();
void sleepNanos(uint64_t nanos);
// Gives the CPU to another runnable thread, if there is one.
void yieldThread();
uint64_t entropy64();
long maxMapCount();
int currentThreadId();
// Sets the calling thread's nice value (Linux keeps one per thread); false if refused.
bool setCurrentThreadNice(int nice);
// Starts a detached thread running main(nullptr) with every signal blocked (the library's
// threads take no signals meant for the application); false if it could not be created.
bool startDetachedThread(void* (*main)(void*));

void futexWait(const void* addr, uint32_t expected);
void futexWakeOne(const void* addr);
void futexWakeAll(const void* addr);
// Waits at most `timeoutNanos` (spurious wake-ups possible).
void futexWaitFor(const void* addr, uint32_t expected, uint64_t timeoutNanos);

// Installs a signal action directly with glibc's __sigaction (so that our own sigaction
// interposer is bypassed). Returns 0 or -1.
int rawSigaction(int signal, const struct sigaction* action, struct sigaction* previous);

// Writes to standard error without allocating.
void writeStderr(const char* text, size_t length);
void writeFd(int fd, const char* text, size_t length);
[[noreturn]] void abortProcess();

// Reads an environment variable before and during libc initialisation (no allocation).
const char* getEnv(const char* name);

// --- Fault injection (tests only; docs/testing.md) ---
// Each wrapper above that can fail for lack of a resource is a fault point. A rule armed on a
// point makes some of its calls fail without reaching the kernel, with the errno the real call
// gives (faultErrno), exactly as the caller would see a refusal. Off (the default), a wrapper
// pays one relaxed load of a global flag; nothing on malloc's fast paths calls a wrapper.
enum class FaultPoint : uint8_t {
  kReserve,    // reserveAligned: mmap of arena segments, page maps, top tables (ENOMEM)
  kMetadata,   // mapMetadata: mmap for the internal heap (ENOMEM)
  kUnmap,      // unmap: munmap (ENOMEM); the range stays mapped
  kDecommit,   // decommit: madvise(MADV_DONTNEED) (ENOMEM)
  kRemap,      // mapFileFixed, mapAnonymousFixed: mmap MAP_FIXED (ENOMEM)
  kProtect,    // protectReadOnly: mprotect(PROT_READ) (ENOMEM)
  kUnprotect,  // protectReadWrite: mprotect(PROT_READ|PROT_WRITE) (ENOMEM)
  kMemfd,      // createSharedFile: memfd_create (EMFILE)
  kResize,     // resizeFile: ftruncate (ENOSPC)
  kPunchHole,  // punchHole: fallocate(FALLOC_FL_PUNCH_HOLE) (ENOMEM)
  kWrite,      // writeToFile: pwrite (ENOSPC)
  kThread,     // startDetachedThread: pthread_create (EAGAIN)
  kCopy,       // replaceWithWritableCopy: mmap + mremap (ENOMEM)
  kCount
};
enum class FaultMode : uint8_t {
  kOff,
  kNth,          // only the n-th call from now fails (n >= 1)
  kEvery,        // every n-th call fails (n = 1: all of them)
  kProbability,  // each call fails with probability perMillion / 1e6, from a seeded generator
};
struct FaultRule {
  FaultMode mode = FaultMode::kOff;
  uint64_t n = 0;
  uint32_t perMillion = 0;
};
const char* faultPointName(FaultPoint point);
int faultErrno(FaultPoint point);
// Arms `rule` on `point` and zeroes its counters (a kOff rule disarms it).
void setFault(FaultPoint point, FaultRule rule);
// Disarms every point (counters keep their values).
void clearFaults();
// Seeds the generator of kProbability rules (the same seed gives the same failures for the
// same sequence of calls).
void seedFaults(uint64_t seed);
// Calls of `point` since its rule was set (counted only while some rule is armed), and how
// many of them were made to fail.
uint64_t faultCalls(FaultPoint point);
uint64_t faultsInjected(FaultPoint point);
// Arms rules from a specification, the syntax of MESHALLOC_FAULTS: comma-separated
// `point:nth=N`, `point:every=N`, `point:p=0.25` (point is a faultPointName, or `all`) and
// `seed=N`. Nothing is armed and false is returned if any part is malformed.
bool configureFaults(const char* spec);

}  // namespace meshalloc::os

namespace meshalloc::os {
// True if `address` lies in the process's brk heap ("[heap]" in /proc/self/maps), i.e. memory
// only glibc's own malloc could have handed out. Slow; for error paths only.
bool isInBrkHeap(uintptr_t address);
}  // namespace meshalloc::os

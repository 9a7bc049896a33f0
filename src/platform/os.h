// Every operating-system call the allocator makes goes through this file, so that the layers
// above stay portable and so that no call here can re-enter malloc.
#pragma once

#include <cstddef>
#include <cstdint>

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
// Anonymous memory for the allocator's own metadata.
void* mapMetadata(size_t bytes);

uint64_t monotonicNanos();
uint64_t entropy64();
long maxMapCount();
int currentThreadId();

void futexWait(const void* addr, uint32_t expected);
void futexWakeOne(const void* addr);

// Writes to standard error without allocating.
void writeStderr(const char* text, size_t length);
void writeFd(int fd, const char* text, size_t length);
[[noreturn]] void abortProcess();

// Reads an environment variable before and during libc initialisation (no allocation).
const char* getEnv(const char* name);

}  // namespace meshalloc::os

namespace meshalloc::os {
// True if `address` lies in the process's brk heap ("[heap]" in /proc/self/maps), i.e. memory
// only glibc's own malloc could have handed out. Slow; for error paths only.
bool isInBrkHeap(uintptr_t address);
}  // namespace meshalloc::os

// Reading meshalloc's statistics from the stress tests (through meshalloc_mallctl).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "meshalloc.h"

namespace stress {

// Takes a fresh statistics snapshot (mallctl "epoch").
inline void refreshStatistics() {
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
}

// A counter by its mallctl name, after an epoch refresh. A name the library does not know is
// a mistake in the test, which would otherwise read as 0: it stops the program.
inline uint64_t readCounter(const char* name) {
  refreshStatistics();
  uint64_t value = 0;
  size_t length = sizeof(value);
  if (meshalloc_mallctl(name, &value, &length, nullptr, 0) != 0) {
    fprintf(stderr, "stress: no counter named %s\n", name);
    abort();
  }
  return value;
}

// The index of `size`'s class in meshalloc's "stats.classes.N" names; -1 if none holds it.
inline int classIndexOf(size_t size) {
  for (unsigned j = 0;; j++) {
    char name[64];
    size_t classSize = 0, length = sizeof(classSize);
    snprintf(name, sizeof(name), "stats.classes.%u.size", j);
    if (meshalloc_mallctl(name, &classSize, &length, nullptr, 0) != 0) return -1;
    if (classSize >= size) return static_cast<int>(j);
  }
}

// Live objects of `size`'s class, with the calling thread's cached slots handed back first.
inline uint64_t liveObjectsOfClass(size_t size) {
  meshalloc_compact();
  refreshStatistics();
  int index = classIndexOf(size);
  if (index < 0) return 0;
  char name[64];
  size_t objects = 0;
  snprintf(name, sizeof(name), "stats.classes.%d.objects", index);
  size_t length = sizeof(objects);
  meshalloc_mallctl(name, &objects, &length, nullptr, 0);
  return objects;
}

// For a failed accounting check: the heap's statistics, then every span of `size`'s class with
// its live count and set bits (mallctl "debug.class_dump"), on stderr. A live count above the
// set bits is a count never taken back; set bits with nothing live, a free never applied.
inline void dumpClassOf(size_t size, int fd) {
  meshalloc_print_stats(fd, 0);
  int index = classIndexOf(size);
  if (index < 0) return;
  unsigned sizeClass = static_cast<unsigned>(index);
  meshalloc_mallctl("debug.class_dump", nullptr, nullptr, &sizeClass, sizeof(sizeClass));
}

}  // namespace stress

// Reading meshalloc's statistics from the stress tests (through meshalloc_mallctl).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "meshalloc.h"

namespace stress {

// A counter by its mallctl name, after an epoch refresh.
inline uint64_t readCounter(const char* name) {
  uint64_t epoch = 1, value = 0;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  length = sizeof(value);
  meshalloc_mallctl(name, &value, &length, nullptr, 0);
  return value;
}

// Live objects of `size`'s class, with the calling thread's cached slots handed back first.
inline uint64_t liveObjectsOfClass(size_t size) {
  meshalloc_compact();
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  for (unsigned j = 0;; j++) {
    char name[64];
    size_t classSize = 0, objects = 0;
    length = sizeof(classSize);
    snprintf(name, sizeof(name), "stats.classes.%u.size", j);
    if (meshalloc_mallctl(name, &classSize, &length, nullptr, 0) != 0) return 0;
    if (classSize < size) continue;
    snprintf(name, sizeof(name), "stats.classes.%u.objects", j);
    length = sizeof(objects);
    meshalloc_mallctl(name, &objects, &length, nullptr, 0);
    return objects;
  }
}

}  // namespace stress

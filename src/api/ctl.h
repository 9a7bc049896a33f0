// jemalloc-style control: dotted names for statistics, options and actions.
#pragma once

#include <cstddef>

namespace meshalloc::api {

int control(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);

}  // namespace meshalloc::api

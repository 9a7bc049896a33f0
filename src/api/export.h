// How api/ exports the functions a program calls or a preloaded library interposes: default
// visibility (the build hides every other symbol), and C linkage for the C entry points. One
// definition for every file that exports.
#pragma once

#define MESHALLOC_EXPORT extern "C" __attribute__((visibility("default")))
// The C++ operators keep their C++ (mangled) names.
#define MESHALLOC_EXPORT_CXX __attribute__((visibility("default")))

// glibc-compatible semantics for every allocation entry point, independent of symbol names so
// that tests can call them in-process without replacing the test binary's own malloc.
#pragma once

#include <malloc.h>
#include <stdio.h>

#include <cstddef>

namespace meshalloc::api {

void* mallocImpl(size_t size);
void freeImpl(void* pointer);
void* callocImpl(size_t count, size_t size);
void* reallocImpl(void* pointer, size_t size);
void* reallocarrayImpl(void* pointer, size_t count, size_t size);
void* memalignImpl(size_t alignment, size_t size);
int posixMemalignImpl(void** result, size_t alignment, size_t size);
void* alignedAllocImpl(size_t alignment, size_t size);
void* vallocImpl(size_t size);
void* pvallocImpl(size_t size);
int trimImpl(size_t pad);
struct mallinfo2 mallinfo2Impl();
struct mallinfo mallinfoImpl();
int malloptImpl(int parameter, int value);
void statsImpl();
int infoImpl(int options, FILE* stream);
size_t compactImpl();

}  // namespace meshalloc::api

/*
 * libmeshalloc-glibc-shim: put glibc's allocator back under a program that was linked
 * against another one (jemalloc, mimalloc, tcmalloc, meshalloc), so `meshalloc compare`
 * can measure that program "on glibc" by LD_PRELOAD.
 *
 * A preloaded library comes first in the global symbol lookup order, so every malloc,
 * free or operator new/delete the program and its libraries make binds here. From here
 * each call must reach glibc's ptmalloc and nothing else. glibc exports its allocator a
 * second time under __libc_* names for exactly this purpose, but an ordinary link-time
 * reference to __libc_malloc is resolved through the same global lookup order, and
 * mimalloc and tcmalloc define __libc_malloc & co. themselves (to catch glibc-internal
 * callers). So the shim looks every target up *inside libc.so.6's own dynamic symbol
 * table*, found with dl_iterate_phdr. Neither step allocates or calls the dynamic
 * loader's dlopen/dlsym, which matters because the first lookup happens inside the
 * process's first malloc, possibly while the dynamic loader itself is still starting up.
 *
 * C++ operator new/delete: jemalloc, mimalloc and tcmalloc all export them, so without
 * the shim's own definitions a C++ program would keep allocating `new` objects from the
 * linked allocator. Deletes go straight to glibc's free. News forward to libstdc++'s own
 * definitions (looked up the same way), which call malloc -- this shim -- and keep the
 * C++ semantics a C library cannot provide (the new_handler loop, std::bad_alloc).
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

static const char kLibcSoname[] = "libc.so.6";
static const char kLibstdcxxSoname[] = "libstdc++.so.6";

/* ----------------------------------------------------------------- failing loudly */

/* Writes a message without allocating (stdio may allocate) and aborts. */
static void shim_die(const char* message) {
  static const char kPrefix[] = "meshalloc-glibc-shim: ";
  ssize_t ignored = write(STDERR_FILENO, kPrefix, sizeof(kPrefix) - 1);
  ignored = write(STDERR_FILENO, message, strlen(message));
  ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  abort();
}

/* ------------------------------------- symbol lookup inside one loaded ELF object */

/* What we need from one loaded object's dynamic section to look a name up in it. */
struct elf_object {
  const char* soname; /* which object to find, e.g. "libc.so.6" */
  int found;
  ElfW(Addr) base;
  const ElfW(Sym) * symbols;
  const char* strings;
  const uint32_t* gnu_hash;     /* DT_GNU_HASH table, preferred */
  const ElfW(Word) * sysv_hash; /* DT_HASH table, the fallback */
  const ElfW(Half) * versions;  /* DT_VERSYM, to skip non-default symbol versions */
};

/* Bit 15 of a DT_VERSYM entry marks a hidden (non-default, name@VERSION) definition. */
#define VERSYM_HIDDEN 0x8000u
/* The GNU hash seed and multiplier (h = h * 33 + c), fixed by the format. */
#define GNU_HASH_SEED 5381u
#define GNU_HASH_MULTIPLIER 33u
/* GNU hash header words: nbuckets, symoffset, bloom_size, bloom_shift. */
#define GNU_HASH_HEADER_WORDS 4
/* SysV hash header words: nbucket, nchain (nchain == number of symbols). */
#define SYSV_HASH_NCHAIN_INDEX 1

/* Most ports keep the loaded dynamic section relocated (absolute addresses); a few keep
 * it read-only with file offsets. An address below the load base can only be an offset. */
static const void* dynamic_pointer(ElfW(Addr) base, ElfW(Addr) value) {
  return (const void*)(value < base ? value + base : value);
}

/* True when `path` names `soname`: its last component is exactly that file name. */
static int path_names(const char* path, const char* soname) {
  if (!path) return 0;
  const char* slash = strrchr(path, '/');
  return strcmp(slash ? slash + 1 : path, soname) == 0;
}

static int find_object(struct dl_phdr_info* info, size_t info_size, void* data) {
  (void)info_size;
  struct elf_object* object = data;
  if (!path_names(info->dlpi_name, object->soname)) return 0;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const ElfW(Dyn)* dyn = (const ElfW(Dyn)*)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    object->base = info->dlpi_addr;
    for (; dyn->d_tag != DT_NULL; dyn++) {
      const void* pointer = dynamic_pointer(info->dlpi_addr, dyn->d_un.d_ptr);
      switch (dyn->d_tag) {
        case DT_SYMTAB:
          object->symbols = pointer;
          break;
        case DT_STRTAB:
          object->strings = pointer;
          break;
        case DT_GNU_HASH:
          object->gnu_hash = pointer;
          break;
        case DT_HASH:
          object->sysv_hash = pointer;
          break;
        case DT_VERSYM:
          object->versions = pointer;
          break;
        default:
          break;
      }
    }
    object->found = object->symbols && object->strings && (object->gnu_hash || object->sysv_hash);
    return 1; /* stop iterating: the object is found (usable or not) */
  }
  return 0;
}

/* Whether symbol `index` is a default-version definition named `name`. */
static int symbol_matches(const struct elf_object* object, uint32_t index, const char* name) {
  const ElfW(Sym)* symbol = &object->symbols[index];
  if (symbol->st_shndx == SHN_UNDEF || symbol->st_value == 0) return 0;
  if (object->versions && (object->versions[index] & VERSYM_HIDDEN)) return 0;
  return strcmp(object->strings + symbol->st_name, name) == 0;
}

static void* symbol_address(const struct elf_object* object, uint32_t index) {
  return (void*)(object->base + object->symbols[index].st_value);
}

static void* lookup_symbol(const struct elf_object* object, const char* name) {
  if (object->gnu_hash) {
    const uint32_t* table = object->gnu_hash;
    uint32_t bucket_count = table[0], first_symbol = table[1], bloom_words = table[2];
    const ElfW(Addr)* bloom = (const ElfW(Addr)*)(table + GNU_HASH_HEADER_WORDS);
    const uint32_t* buckets = (const uint32_t*)(bloom + bloom_words);
    const uint32_t* chain = buckets + bucket_count;
    uint32_t hash = GNU_HASH_SEED;
    for (const unsigned char* c = (const unsigned char*)name; *c; c++)
      hash = hash * GNU_HASH_MULTIPLIER + *c;
    uint32_t index = buckets[hash % bucket_count];
    if (index < first_symbol) return NULL;
    /* Chain entries hold the hash with bit 0 replaced by an end-of-chain flag. */
    for (;; index++) {
      uint32_t entry = chain[index - first_symbol];
      if ((entry | 1u) == (hash | 1u) && symbol_matches(object, index, name))
        return symbol_address(object, index);
      if (entry & 1u) return NULL;
    }
  }
  uint32_t symbol_count = object->sysv_hash[SYSV_HASH_NCHAIN_INDEX];
  for (uint32_t index = 0; index < symbol_count; index++) {
    if (symbol_matches(object, index, name)) return symbol_address(object, index);
  }
  return NULL;
}

/* Looks `name` up in the loaded object `soname`; NULL if either is absent. */
static void* lookup_in(const char* soname, const char* name) {
  struct elf_object object = {.soname = soname};
  dl_iterate_phdr(find_object, &object);
  return object.found ? lookup_symbol(&object, name) : NULL;
}

/* ------------------------------------------------------------- glibc's functions */

/* Every glibc function the shim forwards to, resolved together on first use. */
struct glibc_functions {
  void* (*malloc)(size_t);
  void (*free)(void*);
  void* (*calloc)(size_t, size_t);
  void* (*realloc)(void*, size_t);
  void* (*memalign)(size_t, size_t);
  void* (*valloc)(size_t);
  void* (*pvalloc)(size_t);
  void* (*aligned_alloc)(size_t, size_t);
  int (*posix_memalign)(void**, size_t, size_t);
  void* (*reallocarray)(void*, size_t, size_t);
  size_t (*malloc_usable_size)(void*);
  struct mallinfo (*mallinfo)(void);
  struct mallinfo2 (*mallinfo2)(void);
  int (*mallopt)(int, int);
  int (*malloc_trim)(size_t);
  void (*malloc_stats)(void);
  int (*malloc_info)(int, FILE*);
};

static struct glibc_functions g_glibc;
static atomic_int g_glibc_ready;

/* Resolves one function; the allocation core must exist, the rest is optional so that an
 * older glibc without e.g. mallinfo2 still works for everything else. */
static void* resolve(const char* name, int required) {
  void* address = lookup_in(kLibcSoname, name);
  if (!address && required) {
    static const char kMessage[] = "cannot find glibc's allocator in libc.so.6";
    shim_die(kMessage);
  }
  return address;
}

#define REQUIRED 1
#define OPTIONAL 0

/* Idempotent, so two threads racing here on first use store identical values. The
 * __libc_* names are glibc's public second names for its allocator (GLIBC_2.2.5); the
 * rest have no such twin and are looked up under their own name, still inside libc. */
static void resolve_glibc(void) {
  g_glibc.malloc = resolve("__libc_malloc", REQUIRED);
  g_glibc.free = resolve("__libc_free", REQUIRED);
  g_glibc.calloc = resolve("__libc_calloc", REQUIRED);
  g_glibc.realloc = resolve("__libc_realloc", REQUIRED);
  g_glibc.memalign = resolve("__libc_memalign", REQUIRED);
  g_glibc.valloc = resolve("__libc_valloc", REQUIRED);
  g_glibc.pvalloc = resolve("__libc_pvalloc", REQUIRED);
  g_glibc.aligned_alloc = resolve("aligned_alloc", REQUIRED);
  g_glibc.posix_memalign = resolve("posix_memalign", REQUIRED);
  g_glibc.reallocarray = resolve("reallocarray", OPTIONAL);
  g_glibc.malloc_usable_size = resolve("malloc_usable_size", REQUIRED);
  g_glibc.mallinfo = resolve("__libc_mallinfo", OPTIONAL);
  g_glibc.mallinfo2 = resolve("mallinfo2", OPTIONAL);
  g_glibc.mallopt = resolve("__libc_mallopt", OPTIONAL);
  g_glibc.malloc_trim = resolve("malloc_trim", OPTIONAL);
  g_glibc.malloc_stats = resolve("malloc_stats", OPTIONAL);
  g_glibc.malloc_info = resolve("malloc_info", OPTIONAL);
  atomic_store_explicit(&g_glibc_ready, 1, memory_order_release);
}

static inline const struct glibc_functions* glibc(void) {
  if (__builtin_expect(!atomic_load_explicit(&g_glibc_ready, memory_order_acquire), 0))
    resolve_glibc();
  return &g_glibc;
}

/* Resolving in a constructor as well keeps the first lookup out of any later, possibly
 * multi-threaded, malloc; calls made before it (by the loader or earlier constructors)
 * resolve lazily above. */
__attribute__((constructor)) static void shim_init(void) {
  (void)glibc();
}

/* ---------------------------------------------------------------- C allocation API */

SHIM_EXPORT void* malloc(size_t size) {
  return glibc()->malloc(size);
}
SHIM_EXPORT void free(void* ptr) {
  glibc()->free(ptr);
}
SHIM_EXPORT void* calloc(size_t count, size_t size) {
  return glibc()->calloc(count, size);
}
SHIM_EXPORT void* realloc(void* ptr, size_t size) {
  return glibc()->realloc(ptr, size);
}
SHIM_EXPORT void* memalign(size_t alignment, size_t size) {
  return glibc()->memalign(alignment, size);
}
SHIM_EXPORT void* valloc(size_t size) {
  return glibc()->valloc(size);
}
SHIM_EXPORT void* pvalloc(size_t size) {
  return glibc()->pvalloc(size);
}
SHIM_EXPORT void* aligned_alloc(size_t alignment, size_t size) {
  return glibc()->aligned_alloc(alignment, size);
}
SHIM_EXPORT int posix_memalign(void** result, size_t alignment, size_t size) {
  return glibc()->posix_memalign(result, alignment, size);
}

/* mimalloc exports reallocarray, so the shim must too; glibc before 2.26 has none, and
 * then the same overflow check in front of realloc is glibc's behaviour. */
SHIM_EXPORT void* reallocarray(void* ptr, size_t count, size_t size) {
  if (glibc()->reallocarray) return glibc()->reallocarray(ptr, count, size);
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return glibc()->realloc(ptr, total);
}

/* ---------------------------------------------- introspection, glibc's own copies */

SHIM_EXPORT size_t malloc_usable_size(void* ptr) {
  return glibc()->malloc_usable_size(ptr);
}

SHIM_EXPORT struct mallinfo mallinfo(void) {
  struct mallinfo empty = {0};
  return glibc()->mallinfo ? glibc()->mallinfo() : empty;
}

SHIM_EXPORT struct mallinfo2 mallinfo2(void) {
  struct mallinfo2 empty = {0};
  return glibc()->mallinfo2 ? glibc()->mallinfo2() : empty;
}

SHIM_EXPORT int mallopt(int param, int value) {
  return glibc()->mallopt ? glibc()->mallopt(param, value) : 0;
}
SHIM_EXPORT int malloc_trim(size_t pad) {
  return glibc()->malloc_trim ? glibc()->malloc_trim(pad) : 0;
}

SHIM_EXPORT void malloc_stats(void) {
  if (glibc()->malloc_stats) glibc()->malloc_stats();
}

SHIM_EXPORT int malloc_info(int options, FILE* stream) {
  if (glibc()->malloc_info) return glibc()->malloc_info(options, stream);
  errno = ENOSYS;
  return -1;
}

/* ------------------------------------------------------------ C++ operator new/delete */

/* Marks a libstdc++ symbol that was looked up and is absent, so a program without
 * libstdc++ pays for one lookup, not one per `new`. */
#define LOOKUP_MISSING ((void*)1)

/* Caches one resolved libstdc++ function. Races are benign: every thread finds the same
 * address, so a relaxed store of an identical value is harmless. */
static void* cached_libstdcxx(_Atomic(void*)* slot, const char* name) {
  void* found = atomic_load_explicit(slot, memory_order_relaxed);
  if (!found) {
    found = lookup_in(kLibstdcxxSoname, name);
    if (!found) found = LOOKUP_MISSING;
    atomic_store_explicit(slot, found, memory_order_relaxed);
  }
  return found == LOOKUP_MISSING ? NULL : found;
}

/* A program whose every operator new came from the allocator it links may not load
 * libstdc++ at all; then glibc serves the request directly. A C library cannot throw
 * std::bad_alloc, so a throwing `new` that fails stops the program with a message (a
 * nothrow `new` returns NULL as it should). */
static void* new_without_libstdcxx(size_t size, size_t align, int nothrow) {
  const size_t kSmallestObject = 1; /* `new` of zero bytes still returns a unique pointer */
  void* ptr =
      align ? glibc()->memalign(align, size) : glibc()->malloc(size ? size : kSmallestObject);
  if (!ptr && !nothrow)
    shim_die("out of memory in operator new (libstdc++ not loaded, cannot throw)");
  return ptr;
}

typedef struct nothrow_tag nothrow_tag; /* std::nothrow_t, only ever passed by reference */
static const size_t kNoAlignment = 0;
enum { kThrows = 0, kNothrow = 1 };

/* Each `new` variant forwards to libstdc++'s definition of the same mangled symbol. */
#define FORWARD_NEW(symbol, params, args, size, align, nothrow)        \
  static _Atomic(void*) g_##symbol;                                    \
  SHIM_EXPORT void* symbol params {                                    \
    typedef void*(*fn_t)params;                                        \
    fn_t fn = (fn_t)cached_libstdcxx(&g_##symbol, #symbol);            \
    if (!fn) return new_without_libstdcxx((size), (align), (nothrow)); \
    return fn args;                                                    \
  }

FORWARD_NEW(_Znwm, (size_t size), (size), size, kNoAlignment, kThrows)
FORWARD_NEW(_Znam, (size_t size), (size), size, kNoAlignment, kThrows)
FORWARD_NEW(_ZnwmRKSt9nothrow_t, (size_t size, const nothrow_tag* tag), (size, tag), size,
            kNoAlignment, kNothrow)
FORWARD_NEW(_ZnamRKSt9nothrow_t, (size_t size, const nothrow_tag* tag), (size, tag), size,
            kNoAlignment, kNothrow)
FORWARD_NEW(_ZnwmSt11align_val_t, (size_t size, size_t align), (size, align), size, align, kThrows)
FORWARD_NEW(_ZnamSt11align_val_t, (size_t size, size_t align), (size, align), size, align, kThrows)
FORWARD_NEW(_ZnwmSt11align_val_tRKSt9nothrow_t, (size_t size, size_t align, const nothrow_tag* tag),
            (size, align, tag), size, align, kNothrow)
FORWARD_NEW(_ZnamSt11align_val_tRKSt9nothrow_t, (size_t size, size_t align, const nothrow_tag* tag),
            (size, align, tag), size, align, kNothrow)

/* Every delete releases memory that came from glibc (through the news above). The size,
 * alignment and nothrow arguments only matter to allocators that use them as hints. */
#define FORWARD_DELETE(symbol, params) \
  SHIM_EXPORT void symbol params {     \
    glibc()->free(ptr);                \
  }

FORWARD_DELETE(_ZdlPv, (void* ptr))
FORWARD_DELETE(_ZdaPv, (void* ptr))
FORWARD_DELETE(_ZdlPvm, (void* ptr, size_t size __attribute__((unused))))
FORWARD_DELETE(_ZdaPvm, (void* ptr, size_t size __attribute__((unused))))
FORWARD_DELETE(_ZdlPvRKSt9nothrow_t, (void* ptr, const nothrow_tag* tag __attribute__((unused))))
FORWARD_DELETE(_ZdaPvRKSt9nothrow_t, (void* ptr, const nothrow_tag* tag __attribute__((unused))))
FORWARD_DELETE(_ZdlPvSt11align_val_t, (void* ptr, size_t align __attribute__((unused))))
FORWARD_DELETE(_ZdaPvSt11align_val_t, (void* ptr, size_t align __attribute__((unused))))
FORWARD_DELETE(_ZdlPvmSt11align_val_t, (void* ptr, size_t size __attribute__((unused)),
                                        size_t align __attribute__((unused))))
FORWARD_DELETE(_ZdaPvmSt11align_val_t, (void* ptr, size_t size __attribute__((unused)),
                                        size_t align __attribute__((unused))))
FORWARD_DELETE(_ZdlPvSt11align_val_tRKSt9nothrow_t,
               (void* ptr, size_t align __attribute__((unused)),
                const nothrow_tag* tag __attribute__((unused))))
FORWARD_DELETE(_ZdaPvSt11align_val_tRKSt9nothrow_t,
               (void* ptr, size_t align __attribute__((unused)),
                const nothrow_tag* tag __attribute__((unused))))

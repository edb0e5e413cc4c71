/* The allocation functions' entries: each passes its return address (the
 * caller's call site, which names the block's allocation) to the agent's
 * Rust side (heap.rs). Stable Rust has no way to read a function's return
 * address; C has __builtin_return_address.
 *
 * Preloaded, the exported definitions interpose the C library's. Attached
 * (nothing is interposed), the program's import-table entries for these
 * functions are pointed at the hidden twins (imports.rs): hidden so that
 * their address is the agent's own, as in exec_variadic.c. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>

void *witch_heap_malloc(size_t n, void *ret);
void *witch_heap_calloc(size_t n, size_t m, void *ret);
void *witch_heap_realloc(void *p, size_t n, void *ret);
void *witch_heap_reallocarray(void *p, size_t n, size_t m, void *ret);
void witch_heap_free(void *p);
void *witch_heap_memalign(int which, size_t align, size_t n, void *ret);
int witch_heap_posix_memalign(void **out, size_t align, size_t n, void *ret);
void *witch_heap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off, void *ret);
int witch_heap_munmap(void *addr, size_t len);
void *witch_heap_mremap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr);

/* The direct way (heap/next.rs): the C library's definition to call as a
 * sibling call (no frame of the agent's left between the program and its
 * allocator), or NULL for the full way above. */
typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void (*free_fn)(void *);
malloc_fn witch_heap_malloc_next(size_t n);
calloc_fn witch_heap_calloc_next(size_t n, size_t m);
realloc_fn witch_heap_realloc_next(void *p, size_t n);
free_fn witch_heap_free_next(void *p);

#define RET __builtin_return_address(0)

#define ENTRIES(VIS, PFX)                                                                                   \
    VIS void *PFX##malloc(size_t n) {                                                                       \
        malloc_fn f = witch_heap_malloc_next(n);                                                            \
        if (f) return f(n);                                                                                 \
        return witch_heap_malloc(n, RET);                                                                   \
    }                                                                                                       \
    VIS void *PFX##calloc(size_t n, size_t m) {                                                             \
        calloc_fn f = witch_heap_calloc_next(n, m);                                                         \
        if (f) return f(n, m);                                                                              \
        return witch_heap_calloc(n, m, RET);                                                                \
    }                                                                                                       \
    VIS void *PFX##realloc(void *p, size_t n) {                                                             \
        realloc_fn f = witch_heap_realloc_next(p, n);                                                       \
        if (f) return f(p, n);                                                                              \
        return witch_heap_realloc(p, n, RET);                                                               \
    }                                                                                                       \
    VIS void *PFX##reallocarray(void *p, size_t n, size_t m) { return witch_heap_reallocarray(p, n, m, RET); } \
    VIS void PFX##free(void *p) {                                                                           \
        free_fn f = witch_heap_free_next(p);                                                                \
        if (f) {                                                                                            \
            f(p);                                                                                           \
            return;                                                                                         \
        }                                                                                                   \
        witch_heap_free(p);                                                                                 \
    }                                                                                                       \
    VIS void *PFX##aligned_alloc(size_t a, size_t n) { return witch_heap_memalign(0, a, n, RET); }          \
    VIS void *PFX##memalign(size_t a, size_t n) { return witch_heap_memalign(1, a, n, RET); }               \
    VIS int PFX##posix_memalign(void **out, size_t a, size_t n) {                                           \
        return witch_heap_posix_memalign(out, a, n, RET);                                                   \
    }                                                                                                       \
    VIS void *PFX##mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {                   \
        return witch_heap_mmap(addr, len, prot, flags, fd, off, RET);                                       \
    }                                                                                                       \
    VIS void *PFX##mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {                 \
        return witch_heap_mmap(addr, len, prot, flags, fd, off, RET);                                       \
    }                                                                                                       \
    VIS int PFX##munmap(void *addr, size_t len) { return witch_heap_munmap(addr, len); }                    \
    /* The new address is read only with MREMAP_FIXED, as the C library's                                  \
     * mremap does (its callers need not pass it otherwise). */                                            \
    VIS void *PFX##mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {                     \
        void *new_addr = NULL;                                                                              \
        if (flags & MREMAP_FIXED) {                                                                         \
            va_list ap;                                                                                     \
            va_start(ap, flags);                                                                            \
            new_addr = va_arg(ap, void *);                                                                  \
            va_end(ap);                                                                                     \
        }                                                                                                   \
        return witch_heap_mremap(old, old_len, new_len, flags, new_addr);                                  \
    }

#define EXPORTED __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

ENTRIES(EXPORTED, )
ENTRIES(HIDDEN, witch_attached_)

/* The exported entries' own addresses, whatever their names bind to (an
 * executable that defines malloc binds the name to its own): hidden
 * aliases of the definitions above, for heap.rs's calls_on. */
#pragma GCC diagnostic push
/* (The C library's attributes of the names, `malloc`, `leaf`, do not
 * matter to an alias used only for its address.) */
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#define OWN(name) extern __typeof(name) witch_own_##name __attribute__((alias(#name), visibility("hidden")));
OWN(malloc)
OWN(calloc)
OWN(realloc)
OWN(free)
OWN(aligned_alloc)
OWN(memalign)
OWN(posix_memalign)
#pragma GCC diagnostic pop

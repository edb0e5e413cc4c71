/* A program with its own malloc, calloc, realloc and free in the
 * executable (a bump allocator with a size header): the C library, and a
 * preloaded agent's own allocations, bind to these. Allocation tracking
 * must leave it unharmed. Exits 6.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static char *arena, *next, *end;
static long calls;

void *malloc(size_t n) {
    if (!arena) {
        size_t size = 1UL << 30;
        arena = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (arena == MAP_FAILED) return NULL;
        next = arena, end = arena + size;
    }
    n = (n + 15) & ~(size_t)15;
    if ((size_t)(end - next) < n + 16) return NULL;
    *(size_t *)next = n;
    void *p = next + 16;
    next += n + 16;
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return p;
}

void free(void *p) { (void)p; }

void *calloc(size_t n, size_t m) {
    /* Not malloc + memset, which gcc turns into a call to calloc: itself. */
    volatile char *p = malloc(n * m);
    for (size_t i = 0; p && i < n * m; i++) p[i] = 0;
    return (void *)p;
}

void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (p && q) {
        size_t old = *(size_t *)((char *)p - 16);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

int main(void) {
    char *s = malloc(100000);
    for (int i = 0; i < 100000; i++) s[i] = (char)('a' + i % 26);
    s = realloc(s, 200000);
    long sum = 0;
    for (int k = 0; k < 200; k++) {
        char *t = calloc(1, 50000);
        memcpy(t, s, 50000);
        for (int i = 0; i < 50000; i += 97) sum += t[i];
        free(t);
    }
    /* Through the C library, which calls the executable's malloc. */
    FILE *f = fopen("/proc/self/stat", "r");
    printf("own malloc: %s, sum %ld, stdio %s\n", calls > 200 ? "used" : "NOT USED", sum, f ? "ok" : "failed");
    return 6;
}

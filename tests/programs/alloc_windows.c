/* Small allocations between short runs of work: every few thousand
 * instructions a malloc, calloc or realloc of 16 to 1,000 bytes and a
 * free, the way C++ and Rust programs allocate. witch's heap tracking
 * interposes the allocator, so a code-cache window that left the cache
 * at each of those calls would end after a few thousand instructions
 * at most; a window calls them natively and goes on after them.
 *
 * Usage: alloc_windows [reps]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 256

static long work[N];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 200000;
    unsigned long x = 88172645463325252UL, sum = 0;
    char *keep = NULL;
    for (long r = 0; r < reps; r++) {
        /* About 2,000 instructions of stores and loads. */
        for (int i = 0; i < N; i++) work[i] = work[(i * 7 + 1) % N] + i + r;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = 16 + x % 1000;
        char *p;
        switch (x >> 60 & 3) {
        case 0: p = calloc(1, n); break;
        case 1: p = realloc(keep, n); keep = NULL; break;
        default: p = malloc(n); break;
        }
        if (!p) return 1;
        memset(p, (int)r, n);
        sum += (unsigned char)p[n - 1] + (unsigned long)work[r % N];
        if (keep) free(keep);
        keep = p;
    }
    free(keep);
    printf("alloc_windows %lu\n", sum);
    return 0;
}

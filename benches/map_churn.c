/* The cost of `munmap` under heap tracking: 64 anonymous mappings of 64 KiB
 * to 8 MiB stay mapped (tracked at the default threshold, at eight levels
 * of the table), then LEN bytes are mapped, touched and unmapped N times.
 * witch's `munmap` looks for tracked mappings in the range it unmaps, a
 * few entries of its table per 2^l bytes of the range for each size class
 * 2^l of mappings made, so a long range with small mappings live is its
 * worst case. Prints the mean time of one round.
 *
 * Usage: map_churn N LEN     e.g. map_churn 20000 67108864
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    size_t len = argc > 2 ? strtoul(argv[2], NULL, 0) : 64 << 20;
    for (int k = 0; k < 64; k++)
        if (mmap(NULL, (size_t)(64 << 10) << (k % 8), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
            return 1;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 1;
        p[0] = 1;
        if (munmap(p, len)) return 1;
    }
    printf("%.0f ns per mmap, store and munmap of %zu bytes\n", (now() - t0) / n * 1e9, len);
    return 0;
}

/* Makes holes in its own mappings and later unmaps each whole range, hole
 * included, in one call: correct as long as nothing else maps memory in
 * the meantime (this program has one thread), as natively nothing does.
 * An attached profiler whose memory the kernel put in such a hole would
 * lose it under its running signal handlers.
 *
 * Usage: hole_unmap [rounds]   prints a checksum, exits 0.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define R (64L << 20)
#define HOLE (40L << 20)

static volatile long work[4096];

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200;
    long sum = 0;
    for (long r = 0; r < rounds; r++) {
        char *res = mmap(NULL, R, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (res == MAP_FAILED) return 1;
        if (munmap(res + (R - HOLE) / 2, HOLE) != 0) return 2;
        for (long k = 0; k < 2000; k++)
            for (long i = 0; i < 4096; i++) work[i] += i ^ k;
        if (munmap(res, R) != 0) return 3;
        sum += work[r & 4095];
    }
    printf("hole_unmap %ld\n", sum != 0);
    return 0;
}

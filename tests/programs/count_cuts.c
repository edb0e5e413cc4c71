/* Whole-run counting through code the cache does not run: each rep stores
 * N longs, makes a system call, and allocates and frees a block that
 * witch's heap tracking interposes (64 KiB, the default threshold), so a
 * window leaves the cache twice a rep: at the system call, and at the
 * allocation, which the agent tracks (the free is a native call, which
 * the window goes on after).
 *
 * Stores: reps × N at @store, and reps at @keep (the block's pointer),
 * besides a few hundred at start-up and exit; the allocator's own run
 * natively under the interposers.
 *
 * Usage: count_cuts [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N 4096

static volatile long a[N];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 12000;
    long sum = 0;
    for (long r = 0; r < reps; r++) {
        for (long i = 0; i < N; i++) a[i] = r + i; /* @store */
        sum += syscall(SYS_getppid) > 0;           /* @syscall */
        char *volatile p = malloc(65536);          /* @keep */
        if (!p) return 1;
        free(p);
        sum += a[r % N];
    }
    printf("count_cuts %ld\n", sum);
    return 3;
}

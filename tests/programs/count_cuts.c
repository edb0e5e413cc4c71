/* Whole-run counting through code the cache does not run: each rep stores
 * N longs with a system call after each half, and allocates and frees a
 * block that witch's heap tracking interposes (64 KiB, the default
 * threshold): a window leaves the cache at the two system calls, and calls
 * the allocation and the free natively (windows used to leave at those
 * too).
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
        for (long i = 0; i < N / 2; i++) a[i] = r + i; /* @store */
        sum += syscall(SYS_getppid) > 0;               /* @syscall */
        for (long i = N / 2; i < N; i++) a[i] = r + i; /* @store */
        sum += syscall(SYS_getppid) > 0;               /* @syscall */
        char *volatile p = malloc(65536);          /* @keep */
        if (!p) return 1;
        free(p);
        sum += a[r % N];
    }
    printf("count_cuts %ld\n", sum);
    return 3;
}

/* A loop that calls the vDSO's clock_gettime between its stores: every
 * store of @store is overwritten by the next pass before anything reads it
 * but the last pass's, so an exact count sees n - 64 of its n stores dead
 * (8 bytes each) whatever the clock says.
 *
 * Usage: vdso_calls [n]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long a[64];

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    long odd = 0;
    for (long i = 0; i < n; i++) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        odd += t.tv_nsec & 1;
        a[i & 63] = i; /* @store */
    }
    long sum = 0;
    for (int i = 0; i < 64; i++) sum += a[i]; /* @read */
    printf("vdso_calls %ld %d\n", sum, odd >= 0);
    return 0;
}

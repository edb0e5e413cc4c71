/* Small known answers for the exact mode's value crafts.
 *   @store: each pass stores the same values again: every store after the
 *           first pass is silent (pair <@store, @store>).
 *   @load:  each pass loads the unchanged values again: every load after the
 *           first pass is redundant (pair <@load, @load>).
 * Usage: tiny_silent [n] [passes]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 32;
    long passes = argc > 2 ? atol(argv[2]) : 4;
    volatile long *a = malloc(n * sizeof *a);
    long sum = 0;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < n; i++) a[i] = i * 7;  /* @store */
        for (long i = 0; i < n; i++) sum += a[i];   /* @load */
    }
    printf("tiny_silent %ld\n", sum);
    return 0;
}

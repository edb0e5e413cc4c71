/* objects_known.c with a loop per store: the same stores, the same exact
 * answer (waste fraction 40%; `table` and the @wasted_alloc buffer hold
 * half of the waste each, and half of each one's stored bytes are dead),
 * but each store line runs in a loop of its own, and the first of them
 * follows the load-only @read loop. Natively every store loop takes the
 * same time (one pointer-chase load per store, all arrays in the cache);
 * under the time-driven software sampler the loop after @read is sampled
 * about a third more often than the others, which puts `table`'s own
 * dead fraction near 58%. Kept as a known bias of where windows land.
 *
 * Usage: objects_loops [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define M 1024
#define N (1L << 16)

static volatile long table[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 300;
    volatile long *wasted = NULL, *used = NULL;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0, sum = 0;
    for (long rep = 0; rep < reps; rep++) {
        if (rep % 4 == 0) {
            /* New buffers now and then, so that a session attached while
             * the program runs sees them allocated. */
            free((void *)wasted);
            free((void *)used);
            wasted = malloc(N * sizeof(long)); /* @wasted_alloc */
            used = malloc(N * sizeof(long));   /* @used_alloc */
            if (!wasted || !used) return 1;
        }
        for (long i = 0; i < N; i++) table[i] = c = nxt[c];  /* @table_dead */
        for (long i = 0; i < N; i++) table[i] = c = nxt[c];  /* @table_kill */
        for (long i = 0; i < N; i++) wasted[i] = c = nxt[c]; /* @wasted_dead */
        for (long i = 0; i < N; i++) wasted[i] = c = nxt[c]; /* @wasted_kill */
        for (long i = 0; i < N; i++) used[i] = c = nxt[c];   /* @used_store */
        for (long i = 0; i < N; i++) sum += table[i] + wasted[i] + used[i]; /* @read */
    }
    printf("objects_loops %ld %ld\n", sum, c);
    free((void *)wasted);
    free((void *)used);
    return 3;
}

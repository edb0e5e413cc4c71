/* Waste on two data objects, by construction: a static array and a heap
 * buffer, each stored twice per rep before it is read (the first stores
 * are dead), and a second heap buffer stored once and read (all used).
 *
 * All five stores of an element are made in one loop, so wherever a
 * sampler's window lands it sees them in their true proportions. (With a
 * loop per store, the first store loop after the load-only @read loop was
 * sampled about a third more often than the others under the time-driven
 * software sampler, and `table`'s own dead fraction came out near 58%:
 * see the ignored test in tests/tests/objects.rs.) Of the 5N stores of a
 * rep, 2N are dead: N to `table` (@table_dead, killed by @table_kill) and
 * N to the buffer from @wasted_alloc (@wasted_dead, killed by
 * @wasted_kill). Exact answer: waste fraction 40%; of all waste, `table`
 * holds 50% and the @wasted_alloc buffer 50%; the @used_alloc buffer none;
 * within `table` and within the wasted buffer, 50% of the stored bytes are
 * dead.
 *
 * The buffers are allocated again every 4 reps, each time at the same
 * line (@wasted_alloc, @used_alloc): one heap object each.
 *
 * Usage: objects_known [reps]   prints a checksum, exits 3.
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
        for (long i = 0; i < N; i++) {
            table[i] = c = nxt[c];  /* @table_dead */
            table[i] = c = nxt[c];  /* @table_kill */
            wasted[i] = c = nxt[c]; /* @wasted_dead */
            wasted[i] = c = nxt[c]; /* @wasted_kill */
            used[i] = c = nxt[c];   /* @used_store */
        }
        for (long i = 0; i < N; i++) sum += table[i] + wasted[i] + used[i]; /* @read */
    }
    printf("objects_known %ld %ld\n", sum, c);
    free((void *)wasted);
    free((void *)used);
    return 3;
}

/* Listing 4.2 of the Witch chapter: long-distance dead stores.
 *
 *   for (i ...) array[i] = 0;     // @i: killed by the j loop
 *   for (j ...) array[j] = j;     // @j: killed by the next rep's i loop
 *
 * repeated a number of times.  The array is large (8 MB), so each loop takes
 * ~30 samples at the test's period (-p 50000): by the time the j loop reaches
 * an address sampled in the i loop, many samples have come and gone.
 * With reservoir replacement some i-loop watchpoints survive until the j loop
 * overwrites them, so <@i, @j> is found.  With "replace the oldest" the first
 * few samples of the j loop evict every i-loop watchpoint (all of which lie
 * ahead of j), so <@i, @j> is almost never seen: only when fewer picks than
 * debug registers land in one pass (picks are a Poisson count, about ten a
 * pass), which happens in about one run in forty.
 *
 * What is stored does not matter to DeadCraft; the stored value comes from a
 * pointer chase (c = nxt[c]) so that every store costs the same time and sits
 * right after a stalling load, where a task-clock sampler lands.
 *
 * Usage: listing_4_2 [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 20)
#define M 1024

static volatile long array[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 100;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) array[i] = c = nxt[c]; /* @i */
        for (long j = 0; j < N; j++) array[j] = c = nxt[c]; /* @j */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += array[i];
    printf("listing_4_2 %ld %ld\n", sum, c);
    return 3;
}

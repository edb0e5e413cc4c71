/* Figure 4.2 of the Witch chapter: a[], b[] and x take part in dead writes in
 * a 3:2:1 byte ratio (50% : 33% : 17%).
 *
 * Construction, per rep:
 *   for (i < 3N) a[i] = ...;   // @a: killed by the next rep's @a loop
 *   for (i < 2N) b[i] = ...;   // @b: killed by the next rep's @b loop
 *   for (i < N)  x    = ...;   // @x: killed by its own next iteration
 * All stores are 8 bytes and cost the same time (one pointer-chase load
 * each), so a[], b[] and x receive 3:2:1 of the samples and, since every
 * store is dead, 3:2:1 of the dead bytes: pairs <@a,@a> <@b,@b> <@x,@x> with
 * shares 50%, 33% and 17%.  x's watchpoints trap immediately (dense); a's and
 * b's trap a whole rep later (sparse): proportional attribution is what keeps
 * x from taking most of the waste.
 *
 * Usage: figure_4_2 [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 16)
#define M 1024

static volatile long a[3 * N];
static volatile long b[2 * N];
static volatile long x;
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 600;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < 3 * N; i++) a[i] = c = nxt[c]; /* @a */
        for (long i = 0; i < 2 * N; i++) b[i] = c = nxt[c]; /* @b */
        for (long i = 0; i < N; i++) x = c = nxt[c];        /* @x */
    }
    long sum = x;
    for (long i = 0; i < 3 * N; i++) sum += a[i];
    for (long i = 0; i < 2 * N; i++) sum += b[i];
    printf("figure_4_2 %ld %ld\n", sum, c);
    return 3;
}

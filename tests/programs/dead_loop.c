/* Dead stores by construction: every store of the @w loop is overwritten by
 * the @k loop before anything reads it, and every store of the @k loop is
 * overwritten by the next rep's @w loop (only the last rep's @k stores are
 * read, by the checksum).  Expected: pair <@w, @k> gets >= 90% of what the
 * @w stores are worth, and the program is almost entirely waste.
 *
 * The arrays are large (4 MB) so that a watchpoint armed in the @w loop must
 * survive many later samples before the @k loop reaches its address.
 *
 * Usage: dead_loop [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 19)
#define M 1024

static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store */

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 200;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @w */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @k */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    printf("dead_loop %ld %ld\n", sum, c);
    return 3;
}

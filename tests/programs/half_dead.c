/* Half of the stored bytes are dead, by construction: every store of the
 * @first loop is overwritten by the @second loop before anything reads it;
 * every store of the @second loop is read by the @read loop before the next
 * rep overwrites it.  Exact answer, within main: 50% of the stored bytes are
 * dead (pair <@first, @second>), 50% used (pair <@second, @read>).
 *
 * Both store loops cost the same per store (one pointer-chase load each), so
 * the time-driven software sampler sees them equally often.
 *
 * Usage: half_dead [n] [reps]   prints a checksum, exits 0.  Small n and reps
 * keep the exact (single-stepping) reference fast.
 */
#include <stdio.h>
#include <stdlib.h>

#define M 1024
#define N (1L << 18)

static volatile long a[N]; /* static, so each store is indexed right after its chase load */
static volatile long nxt[M];

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : N;
    long reps = argc > 2 ? atol(argv[2]) : 150;
    if (n < 1 || n > N) n = N;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0, sum = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @first */
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @second */
        for (long i = 0; i < n; i++) sum += a[i];       /* @read */
    }
    printf("half_dead %ld %ld\n", sum, c);
    return 0;
}

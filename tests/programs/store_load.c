/* No dead stores by construction: every store of the @st loop is read by the
 * @ld loop before the next rep overwrites it.  Expected: waste fraction
 * <= 5% (DeadCraft: a store followed by a load is a use).
 *
 * Usage: store_load [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 19)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 400;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0, sum = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @st */
        for (long i = 0; i < N; i++) sum += a[i];       /* @ld */
    }
    printf("store_load %ld %ld\n", sum, c);
    return 3;
}

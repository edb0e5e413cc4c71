/* Approximately silent floating-point stores (SilentCraft, --fp-precision).
 *
 * Every rep stores v[i] = k_i * m, where the integers k_i repeat exactly each
 * rep (a pointer chase restarted at the same place, never 0) and m grows by
 * 0.001 per rep.  So each store changes the double at its address by less
 * than 0.1% relative (never exactly 0): silent at the default precision of
 * 1%, not silent at precision 0.  Expected: with the default, waste fraction
 * >= 80% and >= 90% of the waste is approximate; with --fp-precision 0,
 * waste fraction <= 10%.
 *
 * Usage: silent_float [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 18)
#define M 1024

static volatile double v[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 1000;
    /* A cycle through 1..M-1 that never visits 0, so no product is 0. */
    for (long i = 0; i < M; i++) nxt[i] = i + 1 < M ? i + 1 : 1;
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        double m = 1.0 + 0.001 * (double)rep;
        c = 0;
        for (long i = 0; i < N; i++) v[i] = (double)(c = nxt[c]) * m; /* @fstore */
    }
    double sum = 0;
    for (long i = 0; i < N; i++) sum += v[i];
    printf("silent_float %.6e %ld\n", sum, c);
    return 3;
}

/* The image that forker's child execs: a plain dead-store loop (@xw killed
 * by @xk), no silent or redundant work to speak of.  Prints its argument and
 * a checksum, exits 4.
 *
 * Usage: exec_target [word] [reps]
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 18)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    long reps = argc > 2 ? atol(argv[2]) : 300;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @xw */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @xk */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    printf("exec_target %s %ld\n", argc > 1 ? argv[1] : "-", sum);
    return 4;
}

/* Copies stdin to stdout byte for byte (after a little dead-store work, so
 * the agent has something to sample), exits 0.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < 1000; rep++)
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @cw */
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0)
        if (fwrite(buf, 1, n, stdout) != n) return 1;
    return ferror(stdin) ? 1 : 0;
}

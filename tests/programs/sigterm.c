/* Killed by a signal: prints a line, does some dead-store work, then raises
 * SIGTERM (default action: terminate).  witch should end the same way
 * (killed by SIGTERM, or exit status 128+15) and still leave a profile.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < 2000; rep++)
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @sw */
    printf("sigterm %ld\n", c + a[3]);
    fflush(stdout);
    raise(SIGTERM);
    return 0; /* not reached */
}

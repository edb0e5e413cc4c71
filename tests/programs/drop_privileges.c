/* A program started as root that drops to nobody (setgid, setuid), as
 * daemons do, then does store-heavy work and exits normally.  An
 * undisturbed run prints "running as 65534".
 *
 * Usage: drop_privileges; exits 0 (100 if it could not drop).
 */
#include <grp.h>
#include <stdio.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */

int main(void) {
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) return 100;
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    for (long round = 0; round < 3000; round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
    printf("running as %d\n", (int)getuid());
    return 0;
}

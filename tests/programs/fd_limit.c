/* A program that lowers its own RLIMIT_NOFILE (soft and hard) to 8 after
 * start-up, then counts how many files it can still open, as a sandboxed
 * service might.  It does some store-heavy work and exits normally.  An
 * undisturbed run prints "5 files openable" (descriptors 3 to 7).
 *
 * Usage: fd_limit; exits 0.
 */
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */

int main(void) {
    struct rlimit r = {8, 8};
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) return 100;
    int fds[16], n = 0;
    while (n < 16 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0) n++;
    for (int i = 0; i < n; i++) close(fds[i]);
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    for (long round = 0; round < 3000; round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
    printf("%d files openable\n", n);
    return 0;
}

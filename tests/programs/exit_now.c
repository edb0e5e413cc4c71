/* A program that ends with _exit, skipping atexit handlers, as forked
 * children and some servers do.  It does store-heavy work first.  An
 * undisturbed run prints "done" and exits 5.
 *
 * Usage: exit_now; exits 5.
 */
#include <unistd.h>

#define N (1L << 16)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    for (long round = 0; round < 3000; round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
    write(1, "done\n", 5);
    _exit(5);
}

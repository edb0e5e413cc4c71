/* A multi-threaded program whose heap corruption is caught inside malloc,
 * with the allocator's lock held: glibc aborts (SIGABRT) from there.  A
 * profiler that allocates in its crash handler would deadlock on that
 * lock; the program must die by SIGABRT as it does undisturbed.
 *
 * Usage: crash_in_malloc; dies by SIGABRT.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */
static char *volatile keep[2]; /* so the compiler keeps the allocations */

static void *idle(void *arg) {
    (void)arg;
    pause();
    return NULL;
}

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    pthread_t t;
    if (pthread_create(&t, NULL, idle, NULL) != 0) return 100; /* malloc now locks */
    for (long round = 0; round < 1000; round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
    keep[0] = malloc(64 * 1024 - 64); /* too big for the per-thread caches */
    keep[1] = malloc(64);
    free(keep[0]);
    free(keep[0]); /* caught under the arena lock: "double free or corruption" */
    free(keep[1]);
    return 0;
}

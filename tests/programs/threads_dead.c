/* Four threads, each running the dead-store loop of dead_loop.c on its own
 * array: every store of the @tw loop is overwritten by the @tk loop before
 * being read.  Expected: a profile with >= 4 sampled threads, and after
 * merging the threads' identical contexts, <@tw, @tk> as a top pair with
 * >= 90% of what the @tw stores are worth.
 *
 * Usage: threads_dead [reps]   prints one checksum per thread, exits 3.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
#define N (1L << 18)
#define M 1024

/* With a pointer (not a global array) as the base, gcc -O2 schedules the
 * pointer increment between the chase load and the store, where the
 * task-clock sampler would land instead of on the store; an empty asm after
 * the store keeps the store right after the load (see tests/src/lib.rs). */
#define BARRIER() __asm__ volatile("" ::: "memory")

static volatile long nxt[M]; /* shared, read-only after setup */
static long reps = 250;

struct job { volatile long *a; long sum; };

__attribute__((noinline)) static void *worker(void *arg) {
    struct job *j = arg;
    volatile long *a = j->a;
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) { a[i] = c = nxt[c]; BARRIER(); } /* @tw */
        for (long i = 0; i < N; i++) { a[i] = c = nxt[c]; BARRIER(); } /* @tk */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    j->sum = sum;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atol(argv[1]);
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        jobs[k].a = calloc(N, sizeof(long));
        if (!jobs[k].a || pthread_create(&t[k], NULL, worker, &jobs[k]) != 0) return 100;
    }
    for (int k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < THREADS; k++) printf("threads_dead %d %ld\n", k, jobs[k].sum);
    return 3;
}

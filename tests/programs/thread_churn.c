/* Threads that come and go: each round starts THREADS short-lived threads,
 * each running one dead-store pass over its own small array (every store of
 * the @cw loop is overwritten by the @ck loop), joins them and folds their
 * arrays into a checksum, then checks (without blocking) whether stdin has
 * closed.  Each thread runs for tens of microseconds, far less than a
 * sampling period, and many end while a profiler is still setting them up.
 * The output depends only on the number of rounds.
 *
 * Usage: thread_churn ROUNDS [THREADS]   (ROUNDS 0: run until stdin
 * closes; THREADS defaults to 4); prints "rounds R checksum S", exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N 2048
#define MAX_THREADS 64

static volatile long a[MAX_THREADS][N];

struct job { long t, round; };

static void *work(void *arg) {
    struct job *j = arg;
    volatile long *x = a[j->t];
    for (long i = 0; i < N; i++) x[i] = j->round + i;     /* @cw */
    for (long i = 0; i < N; i++) x[i] = j->round * i + j->t; /* @ck */
    return NULL;
}

int main(int argc, char **argv) {
    long limit = argc > 1 ? atol(argv[1]) : 0, round;
    long threads = argc > 2 ? atol(argv[2]) : 4;
    if (threads < 1 || threads > MAX_THREADS) return 2;
    unsigned long sum = 0;
    for (round = 0; limit ? round < limit : !stdin_closed(); round++) {
        pthread_t t[MAX_THREADS];
        struct job j[MAX_THREADS];
        for (long k = 0; k < threads; k++) {
            j[k] = (struct job){k, round};
            if (pthread_create(&t[k], NULL, work, &j[k]) != 0) return 100;
        }
        for (long k = 0; k < threads; k++) pthread_join(t[k], NULL);
        for (long k = 0; k < threads; k++)
            for (long i = 0; i < N; i += 64) sum = sum * 1000003u + (unsigned long)a[k][i];
    }
    printf("rounds %ld checksum %lu\n", round, sum);
    return 0;
}

/* Small known answers for the exact mode with threads: each of THREADS
 * workers, on its own array of n longs, runs `passes` passes of two store
 * loops and reads the array once at the end.
 *   <@tw, @tk>: every @tw store is overwritten by @tk: passes*n*8 bytes dead
 *               per thread;
 *   <@tk, @tw>: every @tk store but the last pass's is overwritten by the
 *               next pass's @tw: (passes-1)*n*8 bytes dead per thread;
 *   <@tk, @read>: the last pass's @tk stores are read: n*8 bytes used.
 * Judgements are per thread, like the crafts' debug registers.
 * Usage: tiny_threads [n] [passes]   prints one checksum per thread, exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 2

static long n = 16, passes = 3;

struct job { volatile long *a; long sum; };

static void *worker(void *arg) {
    struct job *j = arg;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < n; i++) j->a[i] = p + i;      /* @tw */
        for (long i = 0; i < n; i++) j->a[i] = p * 3 + i;  /* @tk */
    }
    long s = 0;
    for (long i = 0; i < n; i++) s += j->a[i];             /* @read */
    j->sum = s;
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) n = atol(argv[1]);
    if (argc > 2) passes = atol(argv[2]);
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        jobs[k].a = calloc(n, sizeof(long));
        pthread_create(&t[k], 0, worker, &jobs[k]);
    }
    for (int k = 0; k < THREADS; k++) {
        pthread_join(t[k], 0);
        printf("tiny_threads %d %ld\n", k, jobs[k].sum);
    }
    return 0;
}

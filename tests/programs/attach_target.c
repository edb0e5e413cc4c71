/* A long-running service stand-in for attach tests: four worker threads run
 * rounds of the dead-store loop of threads_dead.c (every store of the @aw
 * loop is overwritten by the @ak loop before being read) and fold their
 * arrays into a checksum, until the main thread reads EOF (or a line) on
 * stdin, or ROUNDS rounds have run.  Then it prints the rounds and the
 * checksum, which depend only on the number of rounds: an unprofiled run
 * with that many rounds must print the same.
 *
 * Usage: attach_target ROUNDS   (0: run until stdin closes); exits 7.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 4
#define N (1L << 16)
#define M 1024
#define BARRIER() __asm__ volatile("" ::: "memory")

static volatile long nxt[M];
static volatile int stop, go_round;
static long limit;
static long done_rounds;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t bar;

struct job { volatile long *a; unsigned long sum; };

__attribute__((noinline)) static void round_of(struct job *j, long round) {
    volatile long *a = j->a;
    long c = round & (M - 1);
    for (long i = 0; i < N; i++) { a[i] = c = nxt[c]; BARRIER(); } /* @aw */
    for (long i = 0; i < N; i++) { a[i] = c = nxt[c]; BARRIER(); } /* @ak */
    unsigned long s = 0;
    for (long i = 0; i < N; i++) s = s * 31 + (unsigned long)a[i];
    j->sum = j->sum * 1000003u + s;
}

static void *worker(void *arg) {
    struct job *j = arg;
    for (long round = 0;; round++) {
        /* One thread decides for all whether this round runs. */
        if (pthread_barrier_wait(&bar) == PTHREAD_BARRIER_SERIAL_THREAD)
            go_round = !stop && (limit == 0 || round < limit);
        pthread_barrier_wait(&bar);
        if (!go_round) break;
        round_of(j, round);
        pthread_mutex_lock(&lock);
        if (round + 1 > done_rounds) done_rounds = round + 1;
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

int main(int argc, char **argv) {
    limit = argc > 1 ? atol(argv[1]) : 0;
    for (long i = 0; i < M; i++) nxt[i] = (i * 7 + 1) & (M - 1);
    pthread_barrier_init(&bar, NULL, THREADS);
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        jobs[k].a = calloc(N, sizeof(long));
        jobs[k].sum = 0;
        if (!jobs[k].a || pthread_create(&t[k], NULL, worker, &jobs[k]) != 0) return 100;
    }
    if (limit == 0) {
        char buf[64];
        while (read(0, buf, sizeof buf) > 0 && buf[0] != 'q') {}
        stop = 1;
    }
    for (int k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
    unsigned long sum = 0;
    for (int k = 0; k < THREADS; k++) sum = sum * 131 + jobs[k].sum;
    printf("rounds %ld checksum %lu\n", done_rounds, sum);
    return 7;
}

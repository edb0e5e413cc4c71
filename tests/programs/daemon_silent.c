/* A long-running silent-store service for witchd's tests: a worker thread
 * runs rounds that store, at each a[i], the value it already holds (the
 * chase restarts from the same point every round: @ss is silent from the
 * second round on), then folds the array and the round number into a
 * checksum; until the main thread reads EOF (or a line starting with 'q') on
 * stdin, or ROUNDS rounds have run.  It then prints the rounds and the
 * checksum, which depend only on the number of rounds: an unprofiled run
 * with that many rounds must print the same.
 *
 * Usage: daemon_silent ROUNDS   (0: run until stdin closes); exits 6.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];
static volatile int stop;
static long limit, rounds;
static unsigned long sum;

static void *worker(void *arg) {
    (void)arg;
    for (long round = 0; !stop && (limit == 0 || round < limit); round++) {
        long c = 0;
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ss */
        unsigned long s = (unsigned long)round;
        for (long i = 0; i < N; i += 7) s = s * 31 + (unsigned long)a[i];
        sum = sum * 1000003u + s;
        rounds = round + 1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    limit = argc > 1 ? atol(argv[1]) : 0;
    for (long i = 0; i < M; i++) nxt[i] = (i * 3 + 1) & (M - 1);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 100;
    if (limit == 0) {
        char buf[64];
        ssize_t n;
        while ((n = read(0, buf, sizeof buf)) > 0 && buf[0] != 'q') {}
        stop = 1;
    }
    pthread_join(t, NULL);
    printf("rounds %ld checksum %lu\n", rounds, sum);
    return 6;
}

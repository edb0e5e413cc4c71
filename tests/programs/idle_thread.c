/* A worker that is busy for a while, then waits (blocked in read) for the
 * next job, and whose signal handler asks for an alternate stack
 * (SA_ONSTACK) without the program installing one.  An attach that
 * catches the worker busy and detaches while it waits must keep the
 * alternate stack it lent the worker mapped: the worker's next signal runs
 * on it.  Each line on stdin is a job ("w"); at EOF the worker ends and the
 * program prints what it did, which depends only on the number of jobs.
 *
 * Usage: idle_thread BUSY_MS; exits 8.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define N (1L << 15)
#define M 1024
static volatile long a[N];
static volatile long nxt[M];
static volatile long handled;
static int jobs[2];
static long busy_ms, rounds;
static unsigned long sum;

static void on_usr1(int sig) {
    (void)sig;
    handled++;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    (void)arg;
    char job;
    do {
        raise(SIGUSR1);
        /* Busy for about busy_ms, in whole rounds (the checksum counts rounds). */
        double until = now() + busy_ms / 1e3;
        do {
            long c = rounds & (M - 1);
            for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @iw */
            unsigned long s = 0;
            for (long i = 0; i < N; i++) s = s * 31 + (unsigned long)a[i];
            sum = sum * 1000003u + s;
            rounds++;
        } while (now() < until);
    } while (read(jobs[0], &job, 1) == 1 && job == 'w');
    return NULL;
}

int main(int argc, char **argv) {
    busy_ms = argc > 1 ? atol(argv[1]) : 300;
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0 || pipe(jobs) != 0) return 100;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 101;
    char line[64];
    long n = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (write(jobs[1], "w", 1) != 1) return 102;
        n++;
    }
    if (write(jobs[1], "q", 1) != 1) return 103;
    pthread_join(t, NULL);
    printf("jobs %ld handled %ld\n", n, handled);
    return 8;
}

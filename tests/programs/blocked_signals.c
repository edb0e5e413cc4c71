/* dead_loop.c's stores, in a thread that runs with every signal blocked,
 * the way servers leave signals to one thread: main blocks them all with
 * sigprocmask before starting the worker (which inherits the mask) and the
 * worker blocks them again with pthread_sigmask.  The program's own view of
 * its mask must stay as it set it for its own signals (SIGUSR1 blocked).
 * With `raw`, both block them with the system call itself, through
 * syscall(SYS_rt_sigprocmask, ...) and the kernel's 8-byte set, as
 * runtimes that bypass the C library's wrappers do.
 * Expected: <@w, @k> is found as in dead_loop.c.
 * Usage: blocked_signals [reps [raw]]   prints a checksum, exits 3.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N (1L << 19)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];
static long reps = 150;
static long sum, c;
static int usr1_blocked;
static int raw;

/* Block every signal in `set`, through the C library or the system call. */
static void block(const sigset_t *set, int thread) {
    if (raw)
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, set, NULL, 8);
    else if (thread)
        pthread_sigmask(SIG_BLOCK, set, NULL);
    else
        sigprocmask(SIG_BLOCK, set, NULL);
}

static void *worker(void *arg) {
    (void)arg;
    sigset_t all, now;
    sigfillset(&all);
    block(&all, 1);
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @w */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @k */
    }
    for (long i = 0; i < N; i++) sum += a[i];
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    usr1_blocked = sigismember(&now, SIGUSR1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atol(argv[1]);
    raw = argc > 2 && strcmp(argv[2], "raw") == 0;
    sigset_t all;
    sigfillset(&all);
    block(&all, 0);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    printf("blocked_signals %ld %ld usr1_blocked=%d\n", sum, c, usr1_blocked);
    return 3;
}

/* A long-running dead-store service that replaces its own program (exec)
 * when told to, for witchd's tests: a worker thread runs rounds of
 * dead_loop.c's loops (every store of the @ew loop is overwritten by the
 * @ek loop before being read) while the main thread reads stdin.  A line
 * starting with 'e' makes the main thread exec the program's own executable
 * again (same pid, same name, a fresh image) with GENERATION + 1; a line
 * starting with 'w' makes the worker thread do it (the kernel then gives
 * the worker the process's pid); a line starting with 'v' makes the main
 * thread do it with execv rather than execl.  EOF, or a line starting with
 * 'q', makes it print its generation and exit 5.
 *
 * Usage: daemon_exec [GENERATION]   (0 when absent)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];
static volatile int stop, exec_from_worker;
static volatile long rounds;
static long gen;
static char *name;

static void exec_again_with(int use_execv) {
    char next[32], self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) _exit(102);
    self[len] = 0;
    snprintf(next, sizeof next, "%ld", gen + 1);
    if (use_execv) {
        char *argv[] = {name, next, NULL};
        execv(self, argv);
    } else {
        execl(self, name, next, (char *)NULL);
    }
    _exit(101); /* exec failed */
}

static void exec_again(void) { exec_again_with(0); }

static void *worker(void *arg) {
    (void)arg;
    for (long round = 0; !stop; round++) {
        if (exec_from_worker) exec_again();
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ew */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ek */
        rounds = round + 1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    gen = argc > 1 ? atol(argv[1]) : 0;
    name = argv[0];
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 100;
    char buf[64];
    ssize_t n;
    while ((n = read(0, buf, sizeof buf)) > 0 && buf[0] != 'q') {
        if (buf[0] == 'e') exec_again();
        if (buf[0] == 'v') exec_again_with(1);
        if (buf[0] == 'w') exec_from_worker = 1;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("generation %ld ran %s\n", gen, rounds > 0 ? "rounds" : "no rounds");
    return 5;
}

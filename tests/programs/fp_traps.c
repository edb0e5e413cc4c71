/* A program that unmasks every floating-point exception (as Fortran's
 * -ffpe-trap or a numeric test harness does with feenableexcept) and then
 * does integer work only: in its main thread, in two threads it starts
 * (which inherit the setting), with an allocation now and then, and in a
 * fork child. Natively no exception is ever raised, so nothing traps and
 * no sticky flag is set; a profiler whose own arithmetic ran under the
 * program's control would raise SIGFPE (an inexact division is enough),
 * or leave flags the program then sees.
 *
 * Usage: fp_traps [reps]   (reps 0: works until its stdin closes, a
 *          target to attach to)
 *          prints each thread's raised flags (0) and a checksum; exits 0.
 */
#define _GNU_SOURCE
#include <fenv.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N 8192

static long reps = 3000;
static volatile int stop;

static void *work(void *arg) {
    long *a = malloc(N * sizeof *a), s = 0, r;
    long seed = (long)(size_t)arg;
    for (r = 0; reps ? r < reps : !stop; r++) {
        for (long i = 0; i < N; i++) a[i] = i * r + seed;
        for (long i = 0; i < N; i += 64) s += a[i];
        free(malloc(64 + (r & 255)));
        if (!reps && !seed && (r & 63) == 0 && stdin_closed()) stop = 1;
    }
    free(a);
    printf("thread %ld: flags %d, %s\n", seed, fetestexcept(FE_ALL_EXCEPT), reps ? "" : "done");
    return (void *)(reps ? s : 0);
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atol(argv[1]);
    feenableexcept(FE_ALL_EXCEPT);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, (void *)(i + 1));
    long s = (long)work(0);
    for (int i = 0; i < 2; i++) {
        void *x;
        pthread_join(t[i], &x);
        s += (long)x;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        reps = reps ? reps : 1000;
        work((void *)9);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child: %d; sum %ld\n", status, s);
    return 0;
}

/* A program that turns the time-stamp counter off for itself, as record
 * and replay tools and some sandboxes do (prctl(PR_SET_TSC,
 * PR_TSC_SIGSEGV): a thread's `rdtsc`, and the vDSO's clock_gettime, which
 * reads the counter too, then raise SIGSEGV), and then works in its main
 * thread and in two threads it starts (which inherit the setting),
 * reading no clock itself. Natively it runs to the end; a profiler whose
 * signal handlers read the counter would kill it.
 *
 * Usage: no_tsc prctl|syscall [reps]   (syscall: through syscall(2), as
 *          a program that makes its own system calls does; reps 0: until
 *          its stdin closes, a target to attach to)
 *          prints the setting's state and a checksum per thread (with
 *          reps 0, the rounds each ran), exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N 4096

static long reps = 60000;
static volatile int stop;

/* Stores overwritten before anyone reads them (the first loop), and some
 * that are read (the sum); with reps 0, rounds until `stop` (the sum is
 * then the rounds, which differ from run to run). */
static void *work(void *arg) {
    long *a = calloc(N, sizeof *a);
    long seed = (long)(size_t)arg, s = 0, r;
    for (r = 0; reps ? r < reps : !stop; r++) {
        for (long i = 0; i < N; i++) a[i] = i * r + seed;
        for (long i = 0; i < N; i += 64) s += a[i];
        if (!reps && !seed && (r & 255) == 0 && stdin_closed()) stop = 1;
    }
    free(a);
    return (void *)(reps ? s : r);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (argc > 2) reps = atol(argv[2]);
    int r = strcmp(argv[1], "syscall") == 0 ? (int)syscall(SYS_prctl, PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0)
                                             : prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0);
    int state = 0;
    prctl(PR_GET_TSC, &state, 0, 0, 0);
    printf("set %d, state %d (2: the counter faults)\n", r, state);
    fflush(stdout);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, (void *)(i + 1));
    long s0 = (long)work(0);
    for (int i = 0; i < 2; i++) {
        void *s;
        pthread_join(t[i], &s);
        printf("thread %d: %ld\n", i + 1, (long)s);
    }
    printf("main: %ld\n", s0);
    return 0;
}

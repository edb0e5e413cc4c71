/* A program that turns on syscall user dispatch for itself, as emulators
 * do (Wine catches a Windows program's system calls so): from then on
 * each system call its thread makes from outside an exempt range (here
 * none) raises SIGSYS while a byte of the program's says "block", and the
 * program flips that byte to "block" around its "guest" code, which makes
 * no system call. Natively no SIGSYS ever comes. A profiler whose handlers
 * make system calls in that thread, while the byte says "block", gets
 * them caught: the program's handler counts them, or the process dies.
 *
 * Usage: syscall_dispatch prctl|syscall [reps [late]]
 *          works (reps rounds) before and after turning dispatch on, with
 *          `prctl` or through `syscall(SYS_prctl, ...)`; with `late`, it
 *          works until its stdin closes before it turns dispatch on (a
 *          target to attach to first). Prints a checksum and the SIGSYS
 *          caught; exits 0 (3 if the kernel has no syscall user dispatch).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "stdin_closed.h"

#define DISPATCH 59 /* PR_SET_SYSCALL_USER_DISPATCH */
#define DISPATCH_ON 1
#define ALLOW 0
#define BLOCK 1

static volatile char selector = ALLOW;
static volatile long caught;
static long a[4096];

static void on_sigsys(int s, siginfo_t *si, void *uc) {
    (void)s;
    (void)si;
    (void)uc;
    /* (Its return, rt_sigreturn, is a system call too.) */
    selector = ALLOW;
    caught++;
}

/* Stores overwritten before anyone reads them, and some that are read. */
static long work(long reps, long seed) {
    long s = 0;
    for (long r = 0; r < reps; r++) {
        for (long i = 0; i < 4096; i++) a[i] = i * r + seed;
        for (long i = 0; i < 4096; i += 64) s += a[i];
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long reps = argc > 2 ? atol(argv[2]) : 2000;
    int late = argc > 3 && strcmp(argv[3], "late") == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSYS, &sa, NULL);
    long s = work(reps, 1);
    while (late && !stdin_closed()) s += work(50, 2);
    int r = strcmp(argv[1], "syscall") == 0 ? (int)syscall(SYS_prctl, DISPATCH, DISPATCH_ON, 0, 0, &selector)
                                             : prctl(DISPATCH, DISPATCH_ON, 0, 0, &selector);
    if (r != 0) {
        printf("no syscall user dispatch here\n");
        return 3;
    }
    for (int round = 0; round < 10; round++) {
        selector = BLOCK; /* guest code: no system call */
        s += work(reps / 10 + 1, round);
        selector = ALLOW;
    }
    printf("checksum %ld, SIGSYS caught %ld\n", late ? 0 : s, caught);
    return 0;
}

/* Signals while every access is recorded (`witch CRAFT --exact`): a
 * profiling timer interrupts a dead-store loop every 200 µs of CPU time,
 * asynchronously, wherever the loop is (in a copy of the code cache, under
 * witch); its handler counts and keeps the interrupted PC from its
 * ucontext. Between passes the program also raises SIGUSR1 at itself,
 * synchronously, and counts its handler's runs.
 *
 * Known answer: per pass, @sw stores N longs that @sk overwrites unread
 * (dead), and @sk's are overwritten by the next pass's @sw (dead, but for
 * the last pass, which @read reads). The handlers store to their own
 * variables only.
 *
 * Every PC a handler saw must be one of the program's own (in a mapped
 * object: the program, the C library, the vDSO), never a copy's: a
 * handler that reads its ucontext sees the native code it interrupted.
 *
 * Usage: exact_signals [n] [passes]   prints "raised R handled R", "ticks
 * seen: yes", "pcs: native" and a checksum, exits 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

#define MAX_PCS 4096

static volatile long a[1L << 20];
static volatile long raised_handled;
static volatile long ticks;
static unsigned long pcs[MAX_PCS];

static void on_prof(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    long t = ticks;
    if (t < MAX_PCS) pcs[t] = (unsigned long)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
    ticks = t + 1;
}

static void on_usr1(int sig) {
    (void)sig;
    raised_handled++;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 65536;
    long passes = argc > 2 ? atol(argv[2]) : 300;
    if (n < 1 || n > (1L << 20) || passes < 1) return 2;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, NULL) != 0) return 101;
    struct sigaction su = {0};
    su.sa_handler = on_usr1;
    su.sa_flags = SA_RESTART;
    sigemptyset(&su.sa_mask);
    if (sigaction(SIGUSR1, &su, NULL) != 0) return 102;
    struct itimerval it = {{0, 200}, {0, 200}};
    if (setitimer(ITIMER_PROF, &it, NULL) != 0) return 103;
    long sum = 0;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < n; i++) a[i] = p + i; /* @sw */
        for (long i = 0; i < n; i++) a[i] = p * i; /* @sk */
        raise(SIGUSR1);
    }
    for (long i = 0; i < n; i++) sum += a[i]; /* @read */
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    long seen = ticks < MAX_PCS ? ticks : MAX_PCS, foreign = 0;
    for (long i = 0; i < seen; i++) {
        Dl_info info;
        if (!dladdr((void *)pcs[i], &info) || !info.dli_fname) foreign++;
    }
    printf("raised %ld handled %ld\n", passes, raised_handled);
    printf("ticks seen: %s\n", ticks > 0 ? "yes" : "no");
    printf("pcs: %s\n", foreign ? "foreign" : "native");
    if (foreign) printf("foreign pcs: %ld of %ld\n", foreign, seen);
    printf("exact_signals %ld\n", sum);
    return 0;
}

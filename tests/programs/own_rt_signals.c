/* A program that uses every real-time signal (SIGRTMIN to SIGRTMAX) itself,
 * as event loops, timers and runtimes do, between stretches of work: it
 * queues each one to its own thread with a value, and takes it
 *   handler   with a handler of its own;
 *   wait      blocked, with sigwaitinfo;
 *   signalfd  blocked, by reading a signalfd;
 *   unblock   with its handler, blocked while it is queued, then unblocked
 *             by setting back the mask it saved (which must not block it).
 * Each signal must come back once, with its own value, and nothing else
 * may: natively every one does. Its mask, as the program reads it back
 * while it blocks them, must name every one. A profiler that takes a real-time signal
 * for itself must pass the program's own on, and must not let its own
 * reach the program (a blocked signal of the program's that the profiler
 * ran a handler for killed it: the default action of a real-time signal).
 *
 * With `fork`, a child forked after the work does it all again, in the
 * mask and with the handlers it inherited, and says so first. With
 * `execfail`, halfway through it calls execl on a program that does not
 * exist, and goes on.
 *
 * Usage: own_rt_signals handler|wait|signalfd|unblock [reps [fork|execfail]]
 *          (reps 0: until its stdin closes, a target to attach to)
 *          prints the signals taken, how many were wrong, and a checksum;
 *          exits 0.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N (1L << 14)

static volatile long a[N];
static volatile long taken, wrong, unnamed;
static volatile int expect_sig, expect_val;

static long work(long r) {
    long s = 0;
    for (long i = 0; i < N; i++) a[i] = i + r;
    for (long i = 0; i < N; i += 4) s += a[i];
    return s;
}

static void check(int sig, int val) {
    taken++;
    if (sig != expect_sig || val != expect_val) wrong++;
}

static void on_rt(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    check(sig, si->si_value.sival_int);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "handler";
    long reps = argc > 2 ? atol(argv[2]) : 300;
    int mode = strcmp(how, "wait") == 0 ? 1 : strcmp(how, "signalfd") == 0 ? 2 : strcmp(how, "unblock") == 0 ? 3 : 0;
    sigset_t rt;
    sigemptyset(&rt);
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++) sigaddset(&rt, s);
    int sfd = -1;
    if (mode == 0 || mode == 3) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_rt;
        sa.sa_flags = SA_SIGINFO;
        for (int s = SIGRTMIN; s <= SIGRTMAX; s++) sigaction(s, &sa, NULL);
    } else {
        sigprocmask(SIG_BLOCK, &rt, NULL);
        if (mode == 2 && (sfd = signalfd(-1, &rt, 0)) < 0) return 2;
    }
    long sum = 0, sent = 0;
    int forks = argc > 3 && strcmp(argv[3], "fork") == 0, child = 0;
    int execs = argc > 3 && strcmp(argv[3], "execfail") == 0;
again:
    for (long r = 0; reps ? r < reps : !((r & 15) == 0 && stdin_closed()); r++) {
        for (int s = SIGRTMIN; s <= SIGRTMAX; s++) {
            sum += work(r);
            if (execs && r == reps / 2 && s == SIGRTMIN) execl("/nonexistent/own_rt_signals", "x", (char *)NULL);
            expect_sig = s;
            expect_val = (int)(s * 1000 + r % 1000);
            union sigval v = {.sival_int = expect_val};
            sigset_t saved, now;
            if (mode == 3) sigprocmask(SIG_BLOCK, &rt, &saved);
            if (mode != 0) {
                sigprocmask(SIG_BLOCK, NULL, &now);
                for (int b = SIGRTMIN; b <= SIGRTMAX; b++) unnamed += !sigismember(&now, b);
            }
            if (pthread_sigqueue(pthread_self(), s, v) != 0) return 2;
            sent++;
            if (mode == 3) {
                for (int b = SIGRTMIN; b <= SIGRTMAX; b++) unnamed += sigismember(&saved, b);
                sigprocmask(SIG_SETMASK, &saved, NULL);
            } else if (mode == 1) {
                siginfo_t si;
                int got = sigwaitinfo(&rt, &si);
                check(got, si.si_value.sival_int);
            } else if (mode == 2) {
                struct signalfd_siginfo si;
                if (read(sfd, &si, sizeof si) != sizeof si) return 2;
                check((int)si.ssi_signo, si.ssi_int);
            }
        }
    }
    if (forks && !child) {
        pid_t pid = fork();
        if (pid == 0) {
            child = 1;
            taken = wrong = unnamed = sum = sent = 0;
            goto again;
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 2;
    }
    if (reps)
        printf("%s%s: taken %ld of %ld, wrong %ld, mask wrong %ld; checksum %ld\n", child ? "child " : "", how, taken, sent, wrong, unnamed, sum);
    else
        printf("%s: all taken %d, wrong %ld, mask wrong %ld\n", how, taken == sent, wrong, unnamed);
    return 0;
}

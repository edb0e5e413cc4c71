/* The kernel's cost of one software sample, for the two timers witch can
 * sample with: perf's task-clock (an hrtimer per thread, so an extra timer
 * interrupt at every period) and a POSIX CPU-time timer (checked at the
 * scheduler tick that runs anyway). Rounds of a plain busy loop, the loop
 * under task-clock and the loop under the CPU timer are interleaved, so the
 * machine's drift hits all three alike; the extra thread CPU time over the
 * plain loops, per signal, is the cost (the handler only counts).
 *   gcc -O2 -o target/sampler_cost benches/sampler_cost.c && target/sampler_cost [PERIOD_NS [ROUNDS]]
 * About 70 s at the default 60 rounds; each figure is good to ~±15 µs here. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile long hits;
static void on_signal(int s, siginfo_t *i, void *u) { (void)s; (void)i; (void)u; hits++; }
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double busy(long n) {
    double t = cpu();
    unsigned long x = 1;
    for (long i = 0; i < n; i++) { x = x * 6364136223846793005UL + 1442695040888963407UL; __asm__ volatile("" ::"r"(x)); }
    return cpu() - t;
}

int main(int argc, char **argv) {
    long period = argc > 1 ? atol(argv[1]) : 4000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 60;
    int sig = SIGRTMIN + 1;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_signal; sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(sig, &sa, 0);

    struct perf_event_attr a; memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE; a.size = sizeof a; a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = period; a.disabled = 1; a.exclude_kernel = 1; a.exclude_hv = 1; a.wakeup_events = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) { perror("perf_event_open"); return 1; }
    struct f_owner_ex own = {F_OWNER_TID, gettid()};
    fcntl(fd, F_SETFL, O_ASYNC); fcntl(fd, F_SETSIG, sig); fcntl(fd, F_SETOWN_EX, &own);

    timer_t tid;
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD_ID; ev.sigev_signo = sig; ev._sigev_un._tid = gettid();
    if (timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &tid)) { perror("timer_create"); return 1; }
    struct itimerspec on = {{period / 1000000000, period % 1000000000}, {period / 1000000000, period % 1000000000}}, off = {{0, 0}, {0, 0}};

    long n = (long)(10000000 * 0.4 / busy(10000000)); /* ~0.4 s per loop */
    double t[3] = {0}; long h[3] = {0};
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < 3; m++) {
            long h0 = hits;
            if (m == 1) ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
            if (m == 2) timer_settime(tid, 0, &on, 0);
            t[m] += busy(n);
            if (m == 1) ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
            if (m == 2) timer_settime(tid, 0, &off, 0);
            h[m] += hits - h0;
        }
    printf("period %ld ns, %d rounds of %.2f s per mode\n", period, rounds, t[0] / rounds);
    printf("task-clock: %ld samples, %.1f µs of CPU each\n", h[1], (t[1] - t[0]) / h[1] * 1e6);
    printf("cpu-timer:  %ld samples, %.1f µs of CPU each\n", h[2], (t[2] - t[0]) / h[2] * 1e6);
    return 0;
}

/* A program that uses hardware breakpoints on itself, as some debugging
 * aids and race detectors do: after some work (long enough for a profiler
 * to have armed its watchpoints), it opens four write breakpoints on one
 * of its variables with perf_event_open (through syscall(2), the only way
 * there is), one in a thread of its own, writes the variable and counts
 * the writes each breakpoint saw. Natively all four open (a thread has
 * four debug registers) and each counts every write; a profiler holding
 * them would make the opens fail with ENOSPC.
 *
 * Usage: own_breakpoints [reps]   (reps 0: works until its stdin closes
 *          before it opens them: a target to attach to)
 *          prints how many opened and what they counted, and a checksum;
 *          exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N (1 << 16)

static volatile long target;
static volatile long a[N];

/* Stores overwritten before anyone reads them. */
static void work(long reps) {
    for (long r = 0; reps ? r < reps : !stdin_closed(); r++)
        for (long i = 0; i < N; i += 8) a[i] = i + r;
}

static int open_breakpoint(pid_t tid) {
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof pe);
    pe.type = PERF_TYPE_BREAKPOINT;
    pe.size = sizeof pe;
    pe.bp_type = HW_BREAKPOINT_W;
    pe.bp_addr = (unsigned long)&target;
    pe.bp_len = HW_BREAKPOINT_LEN_8;
    pe.exclude_kernel = 1;
    pe.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &pe, tid, -1, -1, 0);
}

static void *in_thread(void *arg) {
    (void)arg;
    int fd = open_breakpoint(0);
    for (int i = 0; i < 500; i++) target = i;
    long long n = -1;
    if (fd >= 0 && read(fd, &n, sizeof n) != sizeof n) n = -1;
    printf("thread: %s, counted %lld\n", fd >= 0 ? "opened" : strerror(errno), n);
    return NULL;
}

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 3000;
    work(reps);
    int fds[4], opened = 0;
    for (int k = 0; k < 4; k++) {
        fds[k] = open_breakpoint(0);
        if (fds[k] >= 0) opened++;
        else printf("open %d: %s\n", k, strerror(errno));
    }
    for (int i = 0; i < 1000; i++) target = i;
    long long counts[4] = {-1, -1, -1, -1};
    for (int k = 0; k < 4; k++)
        if (fds[k] >= 0 && read(fds[k], &counts[k], sizeof counts[k]) != sizeof counts[k]) counts[k] = -1;
    printf("main: opened %d of 4, counted %lld %lld %lld %lld\n", opened, counts[0], counts[1], counts[2], counts[3]);
    fflush(stdout);
    pthread_t t;
    pthread_create(&t, NULL, in_thread, NULL);
    pthread_join(t, NULL);
    work(reps ? reps : 3000);
    long s = 0;
    for (long i = 0; i < N; i++) s += a[i];
    printf("sum %ld\n", s);
    return 0;
}

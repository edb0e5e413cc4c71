/*
 * One thread waiting with a timeout of its own in semtimedop, on a SysV
 * semaphore nobody posts: the call fails with EAGAIN after MILLISECONDS.
 * Prints how long the wait took, in ms, what it returned, and the thread's
 * voluntary context switches during the call (each time it blocked or was
 * stopped: one natively).
 *
 * With `read`, it waits in read on its stdin instead, until stdin closes
 * (a wait the kernel restarts by itself after a stop), and says so the same
 * way.
 *
 * Usage: timed_wait MILLISECONDS | timed_wait read
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long switches(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_nvcsw;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int by_read = strcmp(argv[1], "read") == 0;
    long ms = atol(argv[1]);
    int sem = by_read ? -1 : semget(IPC_PRIVATE, 1, 0600);
    if (!by_read && sem < 0)
        return 2;
    struct sembuf op = {0, -1, 0};
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
    char buf[64];
    long s0 = switches();
    double t0 = now();
    long r = by_read ? read(0, buf, sizeof buf) : semtimedop(sem, &op, 1, &t);
    int err = r < 0 ? errno : 0;
    double took = now() - t0;
    long s1 = switches();
    if (!by_read)
        semctl(sem, 0, IPC_RMID);
    printf("%s returned %ld%s%s after %.0f ms, %ld voluntary switches\n", by_read ? "read" : "semtimedop", r, err ? " errno " : "",
           err ? strerror(err) : "", took * 1e3, s1 - s0);
    return 0;
}

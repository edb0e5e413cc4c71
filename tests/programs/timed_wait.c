/*
 * One thread waiting with a timeout of its own in semtimedop, on a SysV
 * semaphore nobody posts: the call fails with EAGAIN after MILLISECONDS.
 * Prints how long the wait took, in ms, and what it returned.
 *
 * Usage: timed_wait MILLISECONDS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/sem.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    long ms = atol(argv[1]);
    int sem = semget(IPC_PRIVATE, 1, 0600);
    if (sem < 0)
        return 2;
    struct sembuf op = {0, -1, 0};
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
    double t0 = now();
    int r = semtimedop(sem, &op, 1, &t);
    int err = r < 0 ? errno : 0;
    double took = now() - t0;
    semctl(sem, 0, IPC_RMID);
    printf("semtimedop returned %d%s%s after %.0f ms\n", r, err ? " errno " : "", err ? strerror(err) : "", took * 1e3);
    return 0;
}

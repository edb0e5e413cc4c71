/* Busy for SECONDS of wall time (default 20), storing as it goes, then
 * prints "done" and exits 0: a program for tests that stop a run early
 * (a signal to witch alone, witch itself killed). On SIGINT or SIGQUIT it
 * dies as the default action says.
 *
 * Usage: spin [seconds]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long a[4096];

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 20;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long i = 0;
    for (;;) {
        for (long j = 0; j < 100000; j++) a[(i + j) & 4095] = i + j; /* @s */
        i++;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= secs) break;
    }
    printf("done %ld\n", i);
    return 0;
}

/* A program killed by a signal it has no handler for, after some work:
 * SIGUSR1 by default, or the signal numbered by its argument. Its agent
 * gets no chance to write a profile; witch must say that this is why.
 *
 * Usage: killed_by [SIGNAL]; prints "done", then dies of the signal.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 16)
static volatile long a[N];

int main(int argc, char **argv) {
    int sig = argc > 1 ? atoi(argv[1]) : SIGUSR1;
    for (int r = 0; r < 200; r++)
        for (long i = 0; i < N; i++) a[i] = r + i;
    printf("done\n");
    fflush(stdout);
    raise(sig);
    return 0;
}

/* A program that asks to be traced by its parent (PTRACE_TRACEME), as a
 * program started by a debugger does, then stores for ~0.3 s. Under witch
 * its parent is witch: any signal the program takes stops it for its
 * tracer first, and witch must resume each stop as a tracer that changes
 * nothing (delivering the signal), never mistake one for the program's
 * end, nor kill it.
 *
 * Usage: traceme [reps [signals]]   with `signals`, it also raises SIGUSR1
 * three times, caught by its own handler (run it so only under a parent
 * that resumes traced stops: natively it would stop for good).
 * Prints a checksum and the signals it caught, exits 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>

#define N (1L << 18)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];
static volatile sig_atomic_t caught;

static void on_usr1(int sig) {
    (void)sig;
    caught++;
}

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 300;
    int signals = argc > 2 && strcmp(argv[2], "signals") == 0;
    signal(SIGUSR1, on_usr1);
    if (ptrace(PTRACE_TRACEME, 0, 0, 0) != 0) {
        perror("ptrace(PTRACE_TRACEME)");
        return 9;
    }
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @w */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @k */
        if (signals && rep % 100 == 0) raise(SIGUSR1);
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    printf("traceme %ld %ld caught %d\n", sum, c, (int)caught);
    return 0;
}

/* Faults inside the allocator, left by siglongjmp: every eighth rep frees
 * a pointer that is not a block (16), and glibc's free faults reading the
 * chunk header below it, before it takes any lock; the program's SIGSEGV
 * handler jumps back out. Between them, work and small allocations, so a
 * code-cache window is often inside free (a native call, the thread
 * "away" from the cache) when the fault comes: the handler must run with
 * the program's signal mask, and the jump out must leave nothing of the window
 * behind.
 *
 * Usage: fault_in_free [reps]   prints a checksum and the faults, exits 0.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 256

static long work[N];
static sigjmp_buf env;
static void *volatile not_a_block = (void *)16;

static volatile long wrong_mask;

static void on_segv(int sig) {
    (void)sig;
    /* Natively the handler runs with the program's mask and SIGSEGV:
     * SIGUSR1 is not blocked. */
    sigset_t now;
    sigprocmask(SIG_SETMASK, NULL, &now);
    if (sigismember(&now, SIGUSR1)) wrong_mask++;
    siglongjmp(env, 1);
}

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 200000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    /* No system call between the jump buffer and the fault (a window ends
     * at one): the mask is not saved, and SIGSEGV is not blocked in the
     * handler, so the jump out leaves the mask as it was. */
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &sa, 0);
    unsigned long sum = 0;
    long faults = 0;
    for (long r = 0; r < reps; r++) {
        for (int i = 0; i < N; i++) work[i] = work[(i * 7 + 1) % N] + i + r;
        char *p = malloc(16 + r % 500);
        if (!p) return 1;
        p[0] = (char)r;
        sum += (unsigned char)p[0] + (unsigned long)work[r % N];
        free(p);
        if (r % 8 == 0) {
            if (sigsetjmp(env, 0) == 0) {
                free(not_a_block); /* faults in the allocator */
                return 2;
            }
            faults++;
        }
    }
    printf("fault_in_free %lu faults %ld with a mask not the program's %ld\n", sum, faults, wrong_mask);
    return 0;
}

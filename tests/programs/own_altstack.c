/* A busy single-threaded program with a signal handler of its own that runs
 * on an alternate stack of its own (SA_ONSTACK), as programs that catch
 * their own stack overflows do.  Every round it raises SIGUSR1; the handler
 * notes whether it runs on an alternate stack at all (it must: the program
 * asked for one).  Rounds and checksum work as in busy_single.c.  At the
 * end it checks that its alternate stack is the one it installed: an
 * attach may lend the thread another while profiling, never leave it.
 *
 * With "none" as second argument it installs no alternate stack of its
 * own: its SA_ONSTACK handler then runs on the thread's stack, as the
 * kernel does when there is none (programs and libraries set SA_ONSTACK
 * just in case), and at the end there must still be none: an attach that
 * left the thread an alternate stack of its own, freed at detach, would
 * have the handler run on freed memory.
 *
 * Usage: own_altstack ROUNDS [none]   (0: run until stdin closes); exits 4.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N (1L << 15)
#define M 1024
#define STACK (64 * 1024)

static volatile long a[N];
static volatile long nxt[M];
static volatile long handled, off_stack;
static char *mine;

static void on_usr1(int sig) {
    (void)sig;
    stack_t cur;
    handled++;
    if (sigaltstack(NULL, &cur) != 0 || !(cur.ss_flags & SS_ONSTACK)) off_stack++;
}

int main(int argc, char **argv) {
    long limit = argc > 1 ? atol(argv[1]) : 0, round;
    unsigned long sum = 0;
    int none = argc > 2 && strcmp(argv[2], "none") == 0;
    mine = malloc(STACK);
    stack_t ss = {.ss_sp = mine, .ss_size = STACK, .ss_flags = 0};
    if (!mine || (!none && sigaltstack(&ss, NULL) != 0)) return 100;
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 101;
    for (long i = 0; i < M; i++) nxt[i] = (i * 3 + 7) & (M - 1);
    for (round = 0; limit ? round < limit : !stdin_closed(); round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ow */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ok */
        unsigned long s = 0;
        for (long i = 0; i < N; i++) s = s * 31 + (unsigned long)a[i];
        sum = sum * 1000003u + s;
        raise(SIGUSR1);
    }
    stack_t now;
    sigaltstack(NULL, &now);
    if (none) {
        printf("rounds %ld checksum %lu handled %ld altstack %s\n", round, sum, handled, now.ss_flags & SS_DISABLE ? "none" : "SET");
        return 4;
    }
    printf("rounds %ld checksum %lu handled %ld off-stack %ld altstack %s\n", round, sum, handled, off_stack,
           now.ss_sp == mine && now.ss_size == STACK && !(now.ss_flags & SS_DISABLE) ? "mine" : "NOT MINE");
    return 4;
}

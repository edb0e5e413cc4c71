/* Forks over and over until stdin closes, a fork every few hundred
 * microseconds, so that some child is forked at any moment of an attach.
 * The program handles SIGRTMIN+7 (the signal witch's sampler uses, which a
 * program may use for itself: witch passes the program's own on to its
 * handler); each child raises it at itself once and exits 0 if its handler
 * ran, 1 if not. The parent counts the children and those whose signal was
 * lost, and prints "rounds R missed M"; M must be 0.
 *
 * Usage: fork_loop 0   (runs until stdin closes)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stdin_closed.h"

static volatile sig_atomic_t handled;
static volatile long sink;

static void on_signal(int sig) {
    (void)sig;
    handled = 1;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGRTMIN + 7, &sa, NULL) != 0) return 101;
    long round = 0, missed = 0;
    for (; round % 16 != 0 || !stdin_closed(); round++) {
        /* Some work of the parent's own, for the session to sample. */
        for (long i = 0; i < 20000; i++) sink = sink + i;
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 100; }
        if (pid == 0) {
            handled = 0;
            raise(SIGRTMIN + 7);
            _exit(handled ? 0 : 1);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 102; }
        missed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    printf("rounds %ld missed %ld\n", round, missed);
    return 0;
}

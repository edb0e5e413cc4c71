/* Raises SIGUSR1 at itself every few microseconds and counts its handler's
 * runs: an attach that stops the thread just as a signal is being delivered
 * must deliver it, not drop it (a ptrace signal-delivery stop resumed with
 * no signal discards the program's signal).  Prints "rounds R handled H";
 * H must equal R.
 *
 * Usage: raise_loop ROUNDS   (0: run until stdin closes)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "stdin_closed.h"

static volatile long handled;
static volatile long sink;

static void on_usr1(int sig) {
    (void)sig;
    handled++;
}

int main(int argc, char **argv) {
    long limit = argc > 1 ? atol(argv[1]) : 0, round;
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 101;
    for (round = 0; limit ? round < limit : (round % 64 != 0 || !stdin_closed()); round++) {
        for (long i = 0; i < 2000; i++) sink = sink + i;
        raise(SIGUSR1);
    }
    printf("rounds %ld handled %ld\n", round, handled);
    return 0;
}

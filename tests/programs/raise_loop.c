/* Raises SIGUSR1 at itself every few microseconds and counts its handler's
 * runs: an attach that stops the thread just as a signal is being delivered
 * must deliver it, not drop it (a ptrace signal-delivery stop resumed with
 * no signal discards the program's signal).  Prints "rounds R handled H";
 * H must equal R.
 *
 * With `kill`, it sends the signal to its process (kill(getpid())) rather
 * than to its thread, and also counts the signals whose handler had not run
 * when kill returned ("late"): POSIX has a single-threaded process take it
 * before kill returns, so a thread witch adds must never take it.  Prints
 * "rounds R handled H late L".
 *
 * Usage: raise_loop ROUNDS [kill]   (0: run until stdin closes)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stdin_closed.h"

static volatile long handled;
static volatile long sink;

static void on_usr1(int sig) {
    (void)sig;
    handled++;
}

int main(int argc, char **argv) {
    long limit = argc > 1 ? atol(argv[1]) : 0, round, late = 0;
    int to_process = argc > 2 && strcmp(argv[2], "kill") == 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 101;
    for (round = 0; limit ? round < limit : (round % 64 != 0 || !stdin_closed()); round++) {
        for (long i = 0; i < 2000; i++) sink = sink + i;
        if (to_process) {
            long before = handled;
            kill(getpid(), SIGUSR1);
            late += handled == before;
        } else {
            raise(SIGUSR1);
        }
    }
    if (to_process)
        printf("rounds %ld handled %ld late %ld\n", round, handled, late);
    else
        printf("rounds %ld handled %ld\n", round, handled);
    return 0;
}

/* Stores over and over (dead stores, for a session to watch) until its
 * stdin closes; each 'f' it reads forks a child that lives until stdin
 * closes too, as a server's worker does, and exits 0. Then it waits for its
 * children and prints "rounds R children C".
 *
 * Usage: fork_on_input 0   (runs until stdin closes)
 */
#include <poll.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 4096
static volatile long a[N];

int main(void) {
    long round = 0, children = 0, c = 0;
    for (;; round++) {
        for (long i = 0; i < N; i++) a[i] = c + i;
        for (long i = 0; i < N; i++) a[i] = c - i;
        c++;
        struct pollfd p = {0, POLLIN, 0};
        if (round % 16 != 0 || poll(&p, 1, 0) <= 0) continue;
        char buf[64];
        ssize_t n = read(0, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != 'f') continue;
            pid_t pid = fork();
            if (pid < 0) { perror("fork"); return 100; }
            if (pid == 0) {
                while (read(0, buf, sizeof buf) > 0) {}
                _exit(0);
            }
            children++;
        }
    }
    int st = 0, bad = 0;
    while (wait(&st) > 0) bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("rounds %ld children %ld%s\n", round, children, bad ? " (some failed)" : "");
    return 0;
}

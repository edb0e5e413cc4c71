/* A small debugger: it forks a tracee (PTRACE_TRACEME, then SIGSTOP), sets
 * a hardware watchpoint on the tracee's `watched` through the debug
 * registers (PTRACE_POKEUSER of DR0 and DR7), and counts the stops it sees
 * until the tracee exits: the initial SIGSTOP and one SIGTRAP per store to
 * `watched`.  Both do some store-heavy work, so a profiler has something to
 * sample.  An undisturbed run prints "watchpoint set, 5 traps, 6 stops,
 * tracee exit 0".
 *
 * Usage: debugger; exits 0 (1 if the watchpoint could not be set).
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#define N (1L << 15)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */
static volatile long watched;

static void work(int rounds) {
    for (int r = 0; r < rounds; r++) {
        long c = r & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
}

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    pid_t child = fork();
    if (child < 0) return 100;
    if (child == 0) {
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0) _exit(101);
        raise(SIGSTOP);
        for (int k = 0; k < 5; k++) {
            work(200);
            watched = k;
        }
        _exit(0);
    }
    work(400);
    int status, stops = 0, traps = 0;
    if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status)) return 102;
    stops++;
    const char *set = "watchpoint set";
    char why[128];
    errno = 0;
    if (ptrace(PTRACE_POKEUSER, child, (void *)offsetof(struct user, u_debugreg[0]), (void *)&watched) != 0 ||
        ptrace(PTRACE_POKEUSER, child, (void *)offsetof(struct user, u_debugreg[7]),
               (void *)(1L | (1L << 16) | (3L << 18))) != 0) {
        snprintf(why, sizeof why, "watchpoint NOT set (%s)", strerror(errno));
        set = why;
    }
    ptrace(PTRACE_CONT, child, NULL, NULL);
    for (;;) {
        if (waitpid(child, &status, 0) != child) return 103;
        if (WIFEXITED(status) || WIFSIGNALED(status)) break;
        stops++;
        int sig = WSTOPSIG(status);
        if (sig == SIGTRAP) {
            traps++;
            sig = 0;
        }
        ptrace(PTRACE_CONT, child, NULL, (void *)(long)sig);
    }
    printf("%s, %d traps, %d stops, tracee exit %d\n", set, traps, stops, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return set == why;
}

/* fork + exec under witch.  The parent forks; the child runs the dead-store
 * loop, prints, and execs the program named by argv[1] (exec_target), which
 * runs its own dead-store loop.  The parent runs the loop too, waits for the
 * child, prints the child's exit status, and exits 5.  Output order is fixed:
 * the child's line, exec_target's line, then the parent's line.
 * Expected: three profiles (parent, child before exec, exec'd image).
 *
 * Usage: forker EXEC_TARGET [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define N (1L << 18)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

__attribute__((noinline)) static long dead_work(long reps) {
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @fw */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @fk */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: forker EXEC_TARGET [reps]\n"); return 2; }
    long reps = argc > 2 ? atol(argv[2]) : 300;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 100; }
    if (pid == 0) {
        long s = dead_work(reps);
        printf("forker child %ld\n", s);
        fflush(stdout);
        execl(argv[1], argv[1], "from-child", (char *)NULL);
        perror("execl");
        _exit(127);
    }
    long s = dead_work(reps);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 101; }
    printf("forker parent %ld child-exit %d\n", s, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 5;
}

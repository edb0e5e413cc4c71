/* fork + exec under witch.  The parent forks; the child runs the dead-store
 * loop, prints, and execs the program named by argv[1] (exec_target), which
 * runs its own dead-store loop.  The parent runs the loop too, waits for the
 * child, prints the child's exit status, and exits 5.  Output order is fixed:
 * the child's line, exec_target's line, then the parent's line.
 * Expected: three profiles (parent, child before exec, exec'd image).
 *
 * HOW is how the child execs: "execl" (the default), or "fexecve" on a
 * descriptor of EXEC_TARGET; then the child first tries an fexecve that
 * fails (a descriptor of /dev/null: EACCES), prints its error as the first
 * line, and only then runs its loop.
 *
 * The child passes reps on to exec_target (whose own default is 300).
 *
 * Usage: forker EXEC_TARGET [reps] [HOW]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

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
    if (argc < 2) { fprintf(stderr, "usage: forker EXEC_TARGET [reps] [HOW]\n"); return 2; }
    long reps = argc > 2 ? atol(argv[2]) : 300;
    int by_fd = argc > 3 && strcmp(argv[3], "fexecve") == 0;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 100; }
    if (pid == 0) {
        char *reps_arg = argc > 2 ? argv[2] : NULL;
        char *args[] = {argv[1], "from-child", reps_arg, NULL};
        if (by_fd) {
            int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
            fexecve(null, args, environ);
            printf("forker child fexecve /dev/null: %s\n", strerror(errno));
            fflush(stdout);
            close(null);
        }
        long s = dead_work(reps);
        printf("forker child %ld\n", s);
        fflush(stdout);
        if (by_fd) {
            int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
            fexecve(fd, args, environ);
            perror("fexecve");
        } else {
            execl(argv[1], argv[1], "from-child", reps_arg, (char *)NULL);
            perror("execl");
        }
        _exit(127);
    }
    long s = dead_work(reps);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 101; }
    printf("forker parent %ld child-exit %d\n", s, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 5;
}

/* Starts each program named on its command line with posix_spawn (the
 * last one with posix_spawnp and an empty environment), waits for each,
 * and exits with the number of them that failed (0 when all ran).
 *
 * Usage: spawner PROGRAM...
 */
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    int failed = 0;
    char *empty[] = {NULL};
    for (int i = 1; i < argc; i++) {
        pid_t pid;
        char *args[] = {argv[i], NULL};
        int last = i == argc - 1;
        int r = last ? posix_spawnp(&pid, argv[i], NULL, NULL, args, empty) : posix_spawn(&pid, argv[i], NULL, NULL, args, environ);
        int status = 0;
        if (r != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
            failed++;
            continue;
        }
        printf("%s exited %d\n", argv[i], WEXITSTATUS(status));
    }
    return failed;
}

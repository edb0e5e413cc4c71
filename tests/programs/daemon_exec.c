/* A long-running dead-store service that replaces its own program (exec)
 * when told to, for witch --pid's and witchd's tests: a worker thread runs
 * rounds of dead_loop.c's loops (every store of the @ew loop is overwritten
 * by the @ek loop before being read) while the main thread reads stdin.
 * A command line makes the program exec its own executable again (same pid,
 * same name, a fresh image) with GENERATION + 1 and the same environment:
 *
 *   e  the main thread, by a `syscall` instruction of the program's own
 *      (SYS_execve): an exec no import table shows, which an attached
 *      agent cannot see coming;
 *   w  the worker thread, the same way (the kernel then gives the worker
 *      the process's pid);
 *   v  the main thread, with execv;
 *   l  with execl;
 *   p  with execlp and the executable's bare name, found along a PATH
 *      that starts with its directory;
 *   n  with execle, and the environment DAEMON_EXEC_ENV=execle alone;
 *   f  with fexecve, on a descriptor of the executable;
 *   x  with execl of a file that does not exist: it fails, the program
 *      says "execl failed: <strerror(errno)>" on stderr and runs on.
 *
 * A failed exec (but x's) exits 101. EOF, or a line starting with 'q',
 * makes it print its generation and exit 5.
 *
 * Usage: daemon_exec [GENERATION]   (0 when absent)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];
static volatile int stop, exec_from_worker;
static volatile long rounds;
static long gen;
static char *name;

extern char **environ;

/* execve by the program's own `syscall` instruction (its `syscall()`
 * import may be hooked). */
static long raw_execve(const char *path, char *const argv[], char *const envp[]) {
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "0"((long)SYS_execve), "D"(path), "S"(argv), "d"(envp)
                     : "rcx", "r11", "memory");
    return r;
}

static void exec_again_with(char how) {
    char next[32], self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) _exit(102);
    self[len] = 0;
    snprintf(next, sizeof next, "%ld", gen + 1);
    char *argv[] = {name, next, NULL};
    switch (how) {
    case 'v':
        execv(self, argv);
        break;
    case 'l':
        execl(self, name, next, (char *)NULL);
        break;
    case 'p': {
        char *slash = strrchr(self, '/');
        *slash = 0;
        const char *old = getenv("PATH");
        char path[8192];
        snprintf(path, sizeof path, "%s:%s", self, old ? old : "/usr/bin:/bin");
        setenv("PATH", path, 1);
        execlp(slash + 1, name, next, (char *)NULL);
        break;
    }
    case 'n': {
        char *env[] = {"DAEMON_EXEC_ENV=execle", NULL};
        execle(self, name, next, (char *)NULL, env);
        break;
    }
    case 'f': {
        int fd = open(self, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) fexecve(fd, argv, environ);
        break;
    }
    case 'x':
        execl("/nonexistent/daemon_exec", name, next, (char *)NULL);
        fprintf(stderr, "execl failed: %s\n", strerror(errno));
        return;
    default:
        raw_execve(self, argv, environ);
    }
    _exit(101); /* exec failed */
}

static void exec_again(void) { exec_again_with('e'); }

static void *worker(void *arg) {
    (void)arg;
    for (long round = 0; !stop; round++) {
        if (exec_from_worker) exec_again();
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ew */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ek */
        rounds = round + 1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    gen = argc > 1 ? atol(argv[1]) : 0;
    name = argv[0];
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 100;
    char buf[64];
    ssize_t n;
    while ((n = read(0, buf, sizeof buf)) > 0 && buf[0] != 'q') {
        if (buf[0] == 'w') exec_from_worker = 1;
        else if (buf[0] && strchr("evlpnfx", buf[0])) exec_again_with(buf[0]);
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("generation %ld ran %s\n", gen, rounds > 0 ? "rounds" : "no rounds");
    return 5;
}

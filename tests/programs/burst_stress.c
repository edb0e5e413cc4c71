/* What a single-step burst can meet, all at once, for a long time: the
 * program's own signal handlers at a high rate (one of them leaves with
 * siglongjmp), system calls and vDSO calls in tight loops, `rep movsb` and
 * `rep stosb`, threads starting and ending, fork + exec and fork + _exit.
 * Its output depends only on its arguments, so under witch it must print the
 * same checksum and exit with the same status as natively.
 *
 * Usage: burst_stress [rounds]   prints a checksum, exits 5.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long usr1, jumps;
static __thread sigjmp_buf env;
static __thread volatile int armed;

static void on_usr1(int sig) {
    (void)sig;
    __atomic_fetch_add(&usr1, 1, __ATOMIC_RELAXED); /* several threads raise it */
}

static void on_usr2(int sig) {
    (void)sig;
    if (armed) siglongjmp(env, 1);
}

static void rep_copy(char *dst, const char *src, long n) {
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

static void rep_fill(char *dst, int c, long n) {
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(c) : "memory");
}

static long work(long seed, long n) {
    static __thread char a[4096], b[4096];
    long sum = 0;
    for (long i = 0; i < n; i++) {
        rep_fill(a, (int)(seed + i) & 0xff, 512 + (i & 1023));
        rep_copy(b, a, 1024);
        for (int k = 0; k < 64; k++) b[(i * 7 + k) & 4095] ^= (char)k;
        sum += b[i & 4095] + a[(i * 13) & 4095];
        if ((i & 255) == 0) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t); /* vDSO */
            getppid();                          /* a real system call */
        }
        if ((i & 1023) == 0) raise(SIGUSR1);
        if ((i & 4095) == 0) {
            armed = 1;
            if (sigsetjmp(env, 1) == 0) {
                raise(SIGUSR2);
                sum += 1000000; /* never reached: the handler jumps */
            } else {
                __atomic_fetch_add(&jumps, 1, __ATOMIC_RELAXED);
            }
            armed = 0;
        }
    }
    return sum;
}

static void *thread_main(void *p) {
    long id = (long)p;
    return (void *)work(id * 31, 60000);
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 16;
    signal(SIGUSR1, on_usr1);
    signal(SIGUSR2, on_usr2);
    long total = 0;
    for (long r = 0; r < rounds; r++) {
        pthread_t t[3];
        for (long k = 0; k < 3; k++) pthread_create(&t[k], NULL, thread_main, (void *)(r * 3 + k));
        total += work(r, 40000);
        pid_t c = fork();
        if (c == 0) {
            if (r & 1) execl("/bin/true", "true", (char *)NULL);
            _exit((int)(work(r, 2000) & 0x3f));
        }
        int st = 0;
        waitpid(c, &st, 0);
        total += WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
        for (long k = 0; k < 3; k++) {
            void *ret;
            pthread_join(t[k], &ret);
            total += (long)ret;
        }
    }
    printf("burst_stress %ld %ld %ld\n", total, usr1, jumps);
    return 5;
}

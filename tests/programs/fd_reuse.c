/* A program that closes every descriptor above stderr while a thread is
 * running (as daemons do when they start, with close_range), then opens
 * pipes, which reuse the lowest numbers, and lets the thread end.  It then checks each pipe
 * still works.  A profiler that closed descriptors by number when the
 * thread ended would close the program's pipes.  An undisturbed run prints
 * "8 of 8 pipes work".
 *
 * Usage: fd_reuse; exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N (1L << 16)
#define M 1024
static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store (see tests/src/lib.rs) */
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int go, started;

static void *worker(void *arg) {
    (void)arg;
    for (long round = 0; round < 500; round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c];
    }
    pthread_mutex_lock(&m);
    started = 1;
    pthread_cond_broadcast(&c);
    while (!go) pthread_cond_wait(&c, &m);
    pthread_mutex_unlock(&m);
    return NULL;
}

int main(void) {
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 100;
    pthread_mutex_lock(&m);
    while (!started) pthread_cond_wait(&c, &m);
    pthread_mutex_unlock(&m);
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
        for (int fd = 3; fd < 65536; fd++) close(fd);
    int p[8][2];
    for (int i = 0; i < 8; i++)
        if (pipe(p[i]) != 0) return 101;
    pthread_mutex_lock(&m);
    go = 1;
    pthread_cond_broadcast(&c);
    pthread_mutex_unlock(&m);
    pthread_join(t, NULL);
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        char b = 0;
        if (write(p[i][1], "x", 1) == 1 && read(p[i][0], &b, 1) == 1 && b == 'x') ok++;
    }
    printf("%d of 8 pipes work\n", ok);
    return 0;
}

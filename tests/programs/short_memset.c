/* A short run that spends most of its time in memset: four threads, 25 ms
 * of CPU time each, 100 ms in all (about 20 ticks of the default 5 ms
 * period between them). Each pass clears a 64 KiB buffer (glibc's
 * `rep stosb` at this size: one instruction, 65536 stores; under witch its
 * 64-byte vector loop) and then
 * re-reads a small table nobody changes: after the first pass every load
 * of @load reads the value the previous pass read (a silent load), and the
 * pass's sum goes to a slot the next pass overwrites unread (@sum, dead).
 * Loads are only in the short @load loop, after the long clear: a burst
 * that begins in the clear finds loads only if it gets past it.
 *
 * A thread reads its CPU clock (a system call) once every 64 passes.
 *
 * Usage: short_memset [ms of CPU per thread]   prints one line per thread
 * (the same whatever the number of passes), exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS 4
#define TABLE 512
#define BUF (64 * 1024)

static volatile long table[TABLE]; /* volatile: one scalar load each */
static long cpu_ns = 25000000;

struct job { char *buf; volatile long sum; long last; long passes; };

static long thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker(void *arg) {
    struct job *j = arg;
    long start = thread_cpu_ns(), s = 0, p = 0;
    do {
        for (int k = 0; k < 64; k++, p++) {
            memset(j->buf, (int)p, BUF); /* @clear */
            s = 0;
            for (long i = 0; i < TABLE; i += 4) s += table[i] + table[i + 1] + table[i + 2] + table[i + 3]; /* @load */
            j->sum = s + j->buf[p % BUF]; /* @sum */
        }
    } while (thread_cpu_ns() - start < cpu_ns);
    j->last = s;
    j->passes = p;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) cpu_ns = atol(argv[1]) * 1000000L;
    for (long i = 0; i < TABLE; i++) table[i] = i * 7919 % 1009;
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        jobs[k].buf = malloc(BUF);
        if (!jobs[k].buf || pthread_create(&t[k], NULL, worker, &jobs[k]) != 0) return 100;
    }
    for (int k = 0; k < THREADS; k++) {
        pthread_join(t[k], NULL);
        printf("%ld %s\n", jobs[k].last, jobs[k].passes > 0 ? "ok" : "none");
    }
    return 0;
}

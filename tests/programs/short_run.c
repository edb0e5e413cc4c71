/* A short run: four threads, 40 ms of CPU time each, 160 ms in all, so
 * the default 5 ms period gives about 25 timer ticks between them whatever
 * the machine's speed. Each pass clears a small buffer (memset) and then
 * re-reads a table nobody changes: after the first pass every load of @load
 * reads the value the previous one read (a silent load), and each pass's
 * sum is stored to a slot the next pass overwrites unread (@sum, dead).
 *
 * A thread reads its CPU clock (a system call) once every 256 passes, so
 * the kernel's share of the run stays small. The CPU clock counts the time
 * the kernel spends on a profiler's signals and traps in the thread too, so
 * under a profiler the thread does fewer passes in the same 40 ms.
 *
 * Usage: short_run [ms of CPU per thread]   prints one line per thread
 * (the same whatever the number of passes), exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS 4
#define TABLE 2048
#define BUF (4 * 1024)

static volatile long table[TABLE]; /* volatile: one scalar load each */
static long cpu_ns = 40000000;

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
        for (int k = 0; k < 256; k++, p++) {
            memset(j->buf, (int)p, BUF);
            s = 0;
            for (long i = 0; i < TABLE; i += 4) s += table[i] + table[i + 1] + table[i + 2] + table[i + 3]; /* @load */
            j->sum = s + j->buf[p % BUF];                      /* @sum */
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

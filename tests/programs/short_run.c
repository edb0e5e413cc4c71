/* A short run: four threads, about 100 ms of CPU time in all. Each clears
 * a small buffer (memset) and then re-reads a table nobody changes: after the
 * first pass every load of @load reads the value the previous one read
 * (a silent load), and each pass's sum is stored to a slot the next pass
 * overwrites unread (@sum, dead). At the default period the threads get
 * about 15 timer ticks between them.
 *
 * Usage: short_run [passes]   prints one checksum per thread, exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define TABLE 2048
#define BUF (4 * 1024)

static volatile long table[TABLE]; /* volatile: one scalar load each */
static long passes = 50000;

struct job { char *buf; volatile long sum; long check; };

static void *worker(void *arg) {
    struct job *j = arg;
    long check = 0;
    for (long p = 0; p < passes; p++) {
        memset(j->buf, (int)p, BUF);
        long s = 0;
        for (long i = 0; i < TABLE; i += 4) s += table[i] + table[i + 1] + table[i + 2] + table[i + 3]; /* @load */
        j->sum = s + j->buf[p % BUF];                      /* @sum */
        check += s & 0xff;
    }
    j->check = check;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) passes = atol(argv[1]);
    for (long i = 0; i < TABLE; i++) table[i] = i * 7919 % 1009;
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        jobs[k].buf = malloc(BUF);
        if (!jobs[k].buf || pthread_create(&t[k], NULL, worker, &jobs[k]) != 0) return 100;
    }
    for (int k = 0; k < THREADS; k++) {
        pthread_join(t[k], NULL);
        printf("%ld\n", jobs[k].check);
    }
    return 0;
}

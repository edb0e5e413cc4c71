/* The two exact modes on the same small run: dead and used stores in the
 * main thread and in two workers, a `rep stosq` string whose bytes are
 * overwritten by a loop (dead) and then read (used), and a system call
 * between the loops (the code-cache mode runs it natively and resumes
 * after it).
 * Usage: exact_agree [n] [passes]   prints checksums, exits 3.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 2

static long n = 16, passes = 3;

static void fill(long *a, long count, long v) {
    __asm__ volatile("rep stosq" : "+D"(a), "+c"(count) : "a"(v) : "memory"); /* @stos */
}

static void *worker(void *arg) {
    volatile long *a = arg;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < n; i++) a[i] = p + i;     /* @tw */
        for (long i = 0; i < n; i++) a[i] = p * 3 + i; /* @tk */
    }
    long s = 0;
    for (long i = 0; i < n; i++) s += a[i]; /* @tread */
    return (void *)s;
}

int main(int argc, char **argv) {
    if (argc > 1) n = atol(argv[1]);
    if (argc > 2) passes = atol(argv[2]);
    long *m = calloc(n, sizeof(long));
    long sum = 0;
    for (long p = 0; p < passes; p++) {
        fill(m, n, p);
        getppid();
        for (long i = 0; i < n; i++) ((volatile long *)m)[i] = i * p; /* @over */
        for (long i = 0; i < n; i++) sum += ((volatile long *)m)[i];  /* @read */
    }
    pthread_t t[THREADS];
    long *arrays[THREADS];
    for (int k = 0; k < THREADS; k++) {
        arrays[k] = calloc(n, sizeof(long));
        pthread_create(&t[k], 0, worker, arrays[k]);
    }
    for (int k = 0; k < THREADS; k++) {
        void *r;
        pthread_join(t[k], &r);
        printf("worker %d %ld\n", k, (long)r);
    }
    printf("main %ld\n", sum);
    return 3;
}

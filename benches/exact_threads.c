/* A program with several busy threads, for the exact mode's judges
 * (benches/exact_speed.py --judges): each thread sorts its own array of
 * pseudo-random integers with the C library's qsort, copies it and sums
 * the copy, again and again; the threads share nothing but the C library.
 *
 *     exact_threads THREADS REPS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 2048 };
static int reps;

static int by_value(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void *work(void *arg) {
    unsigned long seed = 12345 + (unsigned long)arg, sum = 0;
    int *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005UL + 1442695040888963407UL;
            a[i] = (int)(seed >> 40);
        }
        qsort(a, N, sizeof *a, by_value);
        memcpy(b, a, N * sizeof *a);
        for (int i = 0; i < N; i += 7) sum += (unsigned)b[i];
    }
    free(a);
    free(b);
    return (void *)sum;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    reps = argc > 2 ? atoi(argv[2]) : 100;
    if (n < 1 || n > 64 || reps < 0) {
        fprintf(stderr, "usage: exact_threads THREADS(1-64) REPS\n");
        return 2;
    }
    pthread_t t[64];
    for (long i = 0; i < n; i++) pthread_create(&t[i], 0, work, (void *)i);
    unsigned long total = 0;
    for (int i = 0; i < n; i++) {
        void *s;
        pthread_join(t[i], &s);
        total += (unsigned long)s;
    }
    printf("%d threads, %d reps: %lu\n", n, reps, total);
    return 0;
}

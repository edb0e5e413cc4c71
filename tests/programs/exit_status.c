/* Exit status pass-through.
 *
 *   exit_status main     does some dead-store work, prints, exit(7) from main
 *   exit_status thread   a second thread does the work, prints and calls
 *                        exit(7) while main is blocked in pthread_join
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N (1L << 16)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

__attribute__((noinline)) static long work(long reps) {
    long c = 0;
    for (long rep = 0; rep < reps; rep++)
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @ew */
    return c + a[5];
}

static void *thread_main(void *arg) {
    (void)arg;
    printf("exit_status thread %ld\n", work(2000));
    fflush(stdout);
    exit(7);
}

int main(int argc, char **argv) {
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    if (argc > 1 && strcmp(argv[1], "thread") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, thread_main, NULL) != 0) return 100;
        pthread_join(t, NULL);
        return 0; /* not reached */
    }
    printf("exit_status main %ld\n", work(2000));
    exit(7);
}

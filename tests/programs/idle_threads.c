/* Many threads that take no CPU time: THREADS of them each sleep 50 ms
 * and end, while the main thread does a short bit of work. A sampler on
 * CPU time samples none of them, so a profile lists few threads or none:
 * the report must still count every thread that ran.
 *
 * Usage: idle_threads [threads]   (default 64); prints the count, exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *idle(void *arg) {
    (void)arg;
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    pthread_t *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, idle, NULL) != 0) return 2;
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("%d threads\n", n);
    return 0;
}

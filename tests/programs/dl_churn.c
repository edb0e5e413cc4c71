/* Loads and unloads two plugins over and over while it works in them:
 * dlopen(A), call, dlclose(A), dlopen(B), call, dlclose(B), ... (A and B
 * are dl_plugin.c's two builds), in THREADS threads at once; the main
 * thread also starts and joins a short thread every 16 rounds. Every call's
 * result is checked against the value it must have.
 *
 * Usage: dl_churn DIR ROUNDS THREADS
 *   DIR holds libdl_plugin_a.so and libdl_plugin_b.so. Each of the THREADS
 *   threads (the main one included) does ROUNDS rounds; ROUNDS 0: the main
 *   thread goes on until its stdin closes (for attaching) and the others
 *   until it stops.
 * Prints "dl_churn ROUNDS EXPECTED MISMATCHES" (the main thread's rounds),
 * exits 3 (2 if a plugin cannot be loaded).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N (1L << 14)
#define REPS 4

typedef long (*work_fn)(volatile long *, long, long);

static char path_a[4096], path_b[4096];
static long expect_a, expect_b;
static long rounds_each;
static volatile int stop;
static long mismatches;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long call(const char *path, volatile long *buf) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dl_churn: %s\n", dlerror());
        exit(2);
    }
    work_fn work = (work_fn)dlsym(h, "plugin_work");
    if (!work) {
        fprintf(stderr, "dl_churn: %s\n", dlerror());
        exit(2);
    }
    long r = work(buf, N, REPS);
    dlclose(h);
    return r;
}

/* One round; returns 1 if a result was wrong. */
static int round_trip(volatile long *buf) {
    int bad = call(path_a, buf) != expect_a;
    bad |= call(path_b, buf) != expect_b;
    return bad;
}

static void *worker(void *arg) {
    (void)arg;
    volatile long *buf = calloc(N, sizeof(long));
    long bad = 0;
    for (long r = 0; rounds_each ? r < rounds_each : !stop; r++) bad += round_trip(buf);
    pthread_mutex_lock(&lock);
    mismatches += bad;
    pthread_mutex_unlock(&lock);
    free((void *)buf);
    return NULL;
}

static void *short_thread(void *arg) { return arg; }

static void *stdin_watch(void *arg) {
    (void)arg;
    char b[256];
    while (read(0, b, sizeof b) > 0) {
    }
    stop = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: dl_churn DIR ROUNDS THREADS\n");
        return 1;
    }
    snprintf(path_a, sizeof path_a, "%s/libdl_plugin_a.so", argv[1]);
    snprintf(path_b, sizeof path_b, "%s/libdl_plugin_b.so", argv[1]);
    rounds_each = atol(argv[2]);
    int threads = atoi(argv[3]);
    volatile long *buf = calloc(N, sizeof(long));
    expect_a = call(path_a, buf);
    expect_b = call(path_b, buf);
    pthread_t watch;
    if (rounds_each == 0) pthread_create(&watch, NULL, stdin_watch, NULL);
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 1; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    long bad = 0, r = 0;
    for (; rounds_each ? r < rounds_each : !stop; r++) {
        bad += round_trip(buf);
        if (r % 16 == 15) {
            pthread_t s;
            pthread_create(&s, NULL, short_thread, NULL);
            pthread_join(s, NULL);
        }
    }
    stop = 1;
    for (int i = 1; i < threads; i++) pthread_join(t[i], NULL);
    if (rounds_each == 0) pthread_join(watch, NULL);
    printf("dl_churn %ld %ld %ld\n", r, expect_a + expect_b, mismatches + bad);
    return 3;
}

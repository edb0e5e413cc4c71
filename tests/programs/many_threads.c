/* Many threads alive at once: THREADS threads with small stacks each store
 * into an array of their own for ROUNDS rounds, then all wait at a barrier
 * so that every one is alive at the same time, and end.  They never call
 * malloc themselves.  At the barrier the program reads its peak memory;
 * at the end its CPU time.
 *
 * Usage: many_threads THREADS ROUNDS [STACK_KIB]
 * Prints the threads and a checksum on stdout, and on stderr
 * "peak_rss_kib N peak_vm_kib N cpu_us N created N"; exits 3.  If a
 * thread cannot be created, the others run as usual and the program says
 * how many were created instead of the checksum, and exits 4. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define LEN 512
#define MAX 10000

static long rounds;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long arrived, released;
static volatile long arrays[MAX][LEN];
static long sums[MAX];

static void *worker(void *arg) {
    long me = (long)arg;
    volatile long *a = arrays[me];
    long s = 0;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < LEN; i++) a[i] = r + i + me; /* @mt */
        for (long i = 0; i < LEN; i++) s += a[i];
    }
    sums[me] = s;
    pthread_mutex_lock(&mu);
    arrived++;
    pthread_cond_broadcast(&cv);
    while (!released)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static long status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) v = atol(line + n);
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: many_threads THREADS ROUNDS [STACK_KIB]\n");
        return 2;
    }
    long n = atol(argv[1]);
    rounds = atol(argv[2]);
    long stack = argc > 3 ? atol(argv[3]) : 64;
    if (n < 1 || n > MAX) return 2;
    static pthread_t t[MAX];
    static int made[MAX];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack << 10);
    long created = 0;
    for (long i = 0; i < n; i++) {
        made[i] = pthread_create(&t[i], &attr, worker, (void *)i) == 0;
        created += made[i];
    }
    /* Every thread that exists is alive here at once. */
    pthread_mutex_lock(&mu);
    while (arrived < created)
        pthread_cond_wait(&cv, &mu);
    long rss = status_kib("VmHWM:"), vm = status_kib("VmPeak:");
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    unsigned long sum = 0;
    for (long i = 0; i < n; i++) {
        if (made[i])
            pthread_join(t[i], NULL);
        sum = sum * 31 + (unsigned long)sums[i];
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long cpu = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000L + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    fprintf(stderr, "peak_rss_kib %ld peak_vm_kib %ld cpu_us %ld created %ld\n", rss, vm, cpu, created);
    if (created < n) {
        printf("threads %ld of %ld created\n", created, n);
        return 4;
    }
    printf("threads %ld checksum %lu\n", n, sum);
    return 3;
}

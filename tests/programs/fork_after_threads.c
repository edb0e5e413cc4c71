/* Threads under an address-space limit, then a fork.  The program lowers
 * its own RLIMIT_AS to its present size plus EXTRA_MIB, starts THREADS
 * threads with small stacks (each stores into an array of its own, and
 * all are alive at once), joins them, gives the limit back, and forks: the child runs the
 * same stores on its one thread and exits 0; the parent waits for it.
 * Under witch, which takes at most a quarter of the limit for its threads,
 * some threads of the parent go unprofiled; the child starts none.
 *
 * Prints "created N" (threads made) and "child 0"; exits 0.
 *
 * Usage: fork_after_threads THREADS EXTRA_MIB */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN 4096
#define MAX 64

static volatile long arrays[MAX + 1][LEN];

static void work(long me) {
    volatile long *a = arrays[me];
    for (long r = 0; r < 2000; r++)
        for (long i = 0; i < LEN; i++) a[i] = r + i;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int released;

/* Stores, then waits until every thread is made: all are alive at once. */
static void *worker(void *arg) {
    work((long)arg);
    pthread_mutex_lock(&mu);
    while (!released) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static long vm_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0) v = atol(line + 7);
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fork_after_threads THREADS EXTRA_MIB\n");
        return 2;
    }
    long threads = atol(argv[1]);
    if (threads > MAX) threads = MAX;
    long extra = atol(argv[2]);
    struct rlimit old, low;
    getrlimit(RLIMIT_AS, &old);
    low = old;
    low.rlim_cur = (rlim_t)(vm_kib() + extra * 1024) * 1024;
    setrlimit(RLIMIT_AS, &low);
    pthread_t t[MAX];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    long created = 0;
    for (long i = 0; i < threads; i++)
        if (pthread_create(&t[created], &attr, worker, (void *)(i + 1)) == 0) created++;
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (long i = 0; i < created; i++) pthread_join(t[i], NULL);
    setrlimit(RLIMIT_AS, &old);
    printf("created %ld\n", created);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        work(0);
        return 0;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return 0;
}

/* Threads that each install an alternate signal stack of their own, of a
 * size the program chooses, with SA_ONSTACK handlers, as gdb does (13.5 KB
 * heap stacks) and as programs sized with MINSIGSTKSZ or SIGSTKSZ do.  A
 * guard page sits right below each stack, so a handler that needs more
 * than the stack holds faults.  Each thread busily stores (so witch
 * samples and traps it: its signals arrive on that stack) and raises
 * SIGUSR1 every round; the handler counts.  Before its stack is
 * installed, each thread fills it with a pattern; at the end it finds the
 * deepest byte written, and the program prints the deepest use of any
 * thread to stderr ("deepest N of SIZE bytes") for the test to compare
 * with a run without witch.
 *
 * Usage: small_altstack SIZE THREADS ROUNDS
 *   SIZE: bytes, or "min" (sysconf(_SC_MINSIGSTKSZ), the least the kernel's
 *   signal frame needs here) or "sig" (sysconf(_SC_SIGSTKSZ)).
 * Prints a checksum and whether every thread still has its own stack;
 * exits 3. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define N (1L << 14)
#define M 1024
#define PATTERN 0xa5
#define MAX_THREADS 64

static long size, rounds;
static volatile long nxt[M];
static volatile long handled[MAX_THREADS];
static long deepest[MAX_THREADS];
static int own[MAX_THREADS];
static unsigned long sums[MAX_THREADS];
static __thread long me;

static void on_usr1(int sig) {
    (void)sig;
    handled[me]++;
}

static void *worker(void *arg) {
    me = (long)arg;
    long page = sysconf(_SC_PAGESIZE);
    long mapped = (size + page - 1) / page * page;
    char *mem = mmap(NULL, page + mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || mprotect(mem, page, PROT_NONE) != 0) {
        perror("stack");
        exit(2);
    }
    char *lo = mem + page;
    memset(lo, PATTERN, size);
    stack_t ss = {.ss_sp = lo, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        perror("sigaltstack");
        exit(2);
    }
    volatile long *a = calloc(N, sizeof *a);
    unsigned long sum = 0;
    for (long r = 0; r < rounds; r++) {
        long c = (r + me) & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @sa */
        unsigned long s = 0;
        for (long i = 0; i < N; i++) s = s * 31 + (unsigned long)a[i];
        sum = sum * 1000003u + s;
        raise(SIGUSR1);
    }
    stack_t now;
    sigaltstack(NULL, &now);
    own[me] = now.ss_sp == lo && now.ss_size == (size_t)size && !(now.ss_flags & SS_DISABLE);
    /* Off the stack now (the handler is done): how deep did anything write? */
    char *p = lo;
    while (p < lo + size && (unsigned char)*p == PATTERN)
        p++;
    deepest[me] = lo + size - p;
    sums[me] = sum;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: small_altstack SIZE THREADS ROUNDS\n");
        return 2;
    }
    size = strcmp(argv[1], "min") == 0 ? sysconf(_SC_MINSIGSTKSZ) : strcmp(argv[1], "sig") == 0 ? sysconf(_SC_SIGSTKSZ) : atol(argv[1]);
    long threads = atol(argv[2]);
    rounds = atol(argv[3]);
    if (threads < 1 || threads > MAX_THREADS || size < 1)
        return 2;
    for (long i = 0; i < M; i++)
        nxt[i] = (i * 7 + 3) & (M - 1);
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return 2;
    pthread_t t[MAX_THREADS];
    for (long i = 1; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
            return 2;
    worker((void *)0);
    for (long i = 1; i < threads; i++)
        pthread_join(t[i], NULL);
    unsigned long sum = 0;
    long deep = 0, mine = 0, calls = 0;
    for (long i = 0; i < threads; i++) {
        sum = sum * 31 + sums[i];
        deep = deepest[i] > deep ? deepest[i] : deep;
        mine += own[i];
        calls += handled[i];
    }
    fprintf(stderr, "deepest %ld of %ld bytes\n", deep, size);
    printf("checksum %lu handled %ld own stacks %ld of %ld\n", sum, calls, mine, threads);
    return 3;
}

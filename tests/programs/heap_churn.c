/* Allocation tracking must not change the program: threads allocating and
 * freeing concurrently (blocks above and below any threshold, every
 * allocation function), realloc that moves a block, malloc_usable_size,
 * anonymous mmap/munmap/mremap (grown, moved, shrunk, cut, and calls
 * that fail), in threads at once, and a fork whose child allocates too. Every block
 * is filled and checked, so a block handed out twice, or a realloc that
 * lost its contents, changes the output.
 *
 * Usage: heap_churn [rounds]   prints one line per part, exits 5.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4
#define SLOTS 64

static long rounds = 5000;

static void fill(unsigned char *p, size_t n, unsigned char v) { memset(p, v, n); }

static int check(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i += 61)
        if (p[i] != v) return 0;
    return n == 0 || p[n - 1] == v;
}

static int mappings(int count);

static void *churn(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    unsigned char *slot[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    unsigned long x = 88172645463325252UL ^ id, bad = 0, sum = 0;
    for (long r = 0; r < rounds; r++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int i = x % SLOTS;
        unsigned char v = (unsigned char)(id * 64 + i);
        if (slot[i]) {
            bad += !check(slot[i], size[i], v);
            if (x & 0x100) {
                /* Grow or shrink in place or by moving. */
                size_t n = (x >> 20) % 3 && size[i] < 60000 ? size[i] * 3 + 1 : size[i] / 2 + 1;
                unsigned char *q = x & 0x200 ? realloc(slot[i], n) : reallocarray(slot[i], 1, n);
                if (!q) return (void *)1;
                bad += !check(q, n < size[i] ? n : size[i], v);
                slot[i] = q, size[i] = n;
                fill(q, n, v);
                continue;
            }
            free(slot[i]);
            slot[i] = NULL;
            continue;
        }
        size_t n = (x >> 8) % 4 == 0 ? 4096 + (x >> 12) % 70000 : 16 + (x >> 12) % 3000;
        switch ((x >> 32) % 4) {
        case 0: slot[i] = malloc(n); break;
        case 1: slot[i] = calloc(1, n); bad += slot[i] && !check(slot[i], n, 0); break;
        case 2: slot[i] = aligned_alloc(64, (n + 63) & ~(size_t)63); n = (n + 63) & ~(size_t)63; break;
        default: {
            void *p = NULL;
            slot[i] = posix_memalign(&p, 4096, n) == 0 ? p : NULL;
        }
        }
        if (!slot[i]) return (void *)1;
        bad += malloc_usable_size(slot[i]) < n;
        size[i] = n;
        fill(slot[i], n, v);
        sum += n;
    }
    for (int i = 0; i < SLOTS; i++) {
        bad += slot[i] && !check(slot[i], size[i], (unsigned char)(id * 64 + i));
        free(slot[i]);
    }
    bad += !mappings(12);
    return (void *)(uintptr_t)(bad ? 2 : 0);
}

/* A block that must move: grown from small until its address changes. */
static int realloc_moves(void) {
    unsigned char *p = malloc(8192), *first = p;
    int moved = 0;
    fill(p, 8192, 7);
    size_t n = 8192;
    unsigned char *blocker = malloc(8192); /* right after p, most likely */
    for (int k = 0; k < 12 && p; k++) {
        size_t m = n * 2;
        unsigned char *q = realloc(p, m);
        if (!q) return -1;
        if (!check(q, n, 7)) return -1;
        moved |= q != first;
        fill(q, m, 7);
        p = q, n = m;
    }
    free(blocker);
    free(p);
    return moved;
}

/* Anonymous mappings made, grown, moved, shrunk and cut: each part keeps
 * its contents, and the calls that must fail fail with the same errno. */
static int mappings(int count) {
    int ok = 1;
    const size_t pg = 4096;
    for (int k = 0; k < count; k++) {
        size_t n = (size_t)(k + 1) * 65536;
        unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 0;
        fill(p, n, 9);
        ok &= check(p, n, 9);
        if (k % 2) {
            /* Grown (perhaps moved), then shrunk in place. */
            unsigned char *q = mremap(p, n, 2 * n, MREMAP_MAYMOVE);
            if (q == MAP_FAILED) return 0;
            ok &= check(q, n, 9) && check(q + n, n, 0);
            p = mremap(q, 2 * n, n, 0);
            ok &= p == q && check(p, n, 9);
        }
        if (k % 3 == 0) {
            /* Moved to a place of a reservation's. */
            unsigned char *r = mmap(NULL, 2 * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (r == MAP_FAILED) return 0;
            unsigned char *q = mremap(p, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, r + n);
            ok &= q == r + n && check(q, n, 9);
            ok &= munmap(r, n) == 0;
            p = q;
        }
        /* Failures: an unaligned address, a fixed move that may not move. */
        errno = 0;
        ok &= munmap(p + 1, pg) == -1 && errno == EINVAL;
        errno = 0;
        ok &= mremap(p, n, n, MREMAP_FIXED, p + n) == MAP_FAILED && errno == EINVAL;
        ok &= check(p, n, 9);
        /* Cut: a page off the front and, when there are 3 pages left, the middle one. */
        ok &= munmap(p, pg) == 0;
        p += pg, n -= pg;
        ok &= check(p, n, 9);
        if (n >= 3 * pg) {
            ok &= munmap(p + pg, pg) == 0;
            ok &= check(p, pg, 9) && check(p + 2 * pg, n - 2 * pg, 9);
            ok &= munmap(p, pg) == 0;
            p += 2 * pg, n -= 2 * pg;
        }
        ok &= munmap(p, n) == 0;
    }
    return ok;
}

int main(int argc, char **argv) {
    if (argc > 1) rounds = atol(argv[1]);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, churn, (void *)i)) return 1;
    int moved = realloc_moves();
    pid_t child = fork();
    if (child == 0) {
        /* The child frees what the parent allocated before the fork, and
         * allocates its own. */
        int r = realloc_moves() >= 0 && mappings(50);
        _exit(r ? 11 : 12);
    }
    long threads_bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        threads_bad += (long)(uintptr_t)r;
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("threads: %s\n", threads_bad ? "BAD" : "ok");
    printf("realloc: %s\n", moved > 0 ? "moved, contents kept" : moved == 0 ? "never moved" : "BAD");
    printf("mmap: %s\n", mappings(50) ? "ok" : "BAD");
    printf("fork: child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 5;
}

/* Waste on anonymous mappings that mremap moves and munmap cuts, by
 * construction. Every 4 reps:
 *
 * - A is mapped (@map_a, 1 MiB), filled and read; a page mapped right after it
 *   makes the mremap that grows it to 2 MiB (@grow, MREMAP_MAYMOVE) move
 *   it, which frees A's first address range;
 * - B is mapped (@map_b, 1 MiB) at A's first address, now free: a witch
 *   that still took that range for A's would credit B's waste to A;
 * - a reservation R (@reserve, 4 MiB, PROT_NONE) is mapped, and A is moved
 *   into its middle (@move, MREMAP_MAYMOVE | MREMAP_FIXED), which unmaps
 *   that part of R; A's contents are checked;
 * - A's first half is unmapped (@unmap_half); its second half stays.
 *
 * Then each rep stores the rest of A three times per element (@rest_dead1,
 * @rest_dead2 dead, killed by @rest_kill) and B twice (@b_dead, killed by
 * @b_kill), all in one loop, and reads both. Exact answer: of all waste,
 * 2/3 on A's mapping (named by its allocation, @map_a: a mapping moved by
 * mremap keeps its name; its 1 MiB left after the cut is its size), 1/3 on
 * B's (@map_b), none on R nor on any range that was unmapped.
 *
 * Usage: heap_remap [reps]   prints a checksum, exits 3.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define S (1L << 20)
#define N (S / (long)sizeof(long))
#define M 1024
#define RW (PROT_READ | PROT_WRITE)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static volatile long nxt[M];

struct maps {
    volatile long *rest, *b;
    char *reserve;
};

/* The mappings of the next 4 reps, or 0 when a call failed or A's
 * contents did not survive. */
static int setup(struct maps *m, long rep, long *moves, long *sum) {
    char *a = mmap(NULL, S, RW, ANON, -1, 0); /* @map_a */
    if (a == MAP_FAILED) return 0;
    /* Filled and read in place: these stores are used (a watch left on
     * the address after the move would see B's stores there). */
    for (long i = 0; i < N; i++) ((volatile long *)a)[i] = i ^ rep;
    for (long i = 0; i < N; i++) *sum += ((volatile long *)a)[i];
    /* Whether this page or something else is there, A can't grow in place. */
    void *stop = mmap(a + S, 4096, PROT_NONE, ANON | MAP_FIXED_NOREPLACE, -1, 0);
    char *grown = mremap(a, S, 2 * S, MREMAP_MAYMOVE); /* @grow */
    if (grown == MAP_FAILED) return 0;
    *moves += grown != a;
    /* A hint: A's old range is free, and the kernel takes it. */
    m->b = mmap(a, S, RW, ANON, -1, 0); /* @map_b */
    if (m->b == MAP_FAILED) return 0;
    if (stop != MAP_FAILED) munmap(stop, 4096);
    m->reserve = mmap(NULL, 4 * S, PROT_NONE, ANON, -1, 0); /* @reserve */
    if (m->reserve == MAP_FAILED) return 0;
    char *moved = mremap(grown, 2 * S, 2 * S, MREMAP_MAYMOVE | MREMAP_FIXED, m->reserve + S); /* @move */
    if (moved != m->reserve + S) return 0;
    for (long i = 0; i < N; i++)
        if (((long *)moved)[i] != (i ^ rep) || ((long *)moved)[N + i] != 0) return 0;
    if (munmap(moved, S) != 0) return 0; /* @unmap_half */
    m->rest = (volatile long *)(moved + S);
    return 1;
}

static void teardown(struct maps *m) {
    /* R's first end, then one call over A's rest and R's other end. Not one
     * call over all of R: that would also unmap the hole @unmap_half left,
     * where anything mapped since (by another thread, a library, an attached
     * profiler's agent) would be lost. */
    munmap(m->reserve, S);
    munmap(m->reserve + 2 * S, 2 * S);
    munmap((void *)m->b, S);
}

int main(int argc, char **argv) {
    long reps = argc > 1 ? atol(argv[1]) : 200;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    struct maps m = {0};
    long c = 0, sum = 0, moves = 0, cycles = 0;
    for (long rep = 0; rep < reps; rep++) {
        if (rep % 4 == 0) {
            if (rep) teardown(&m);
            if (!setup(&m, rep, &moves, &sum)) {
                printf("heap_remap: BAD mapping at rep %ld\n", rep);
                return 1;
            }
            cycles++;
        }
        volatile long *rest = m.rest, *b = m.b;
        for (long i = 0; i < N; i++) {
            rest[i] = c = nxt[c]; /* @rest_dead1 */
            rest[i] = c = nxt[c]; /* @rest_dead2 */
            rest[i] = c = nxt[c]; /* @rest_kill */
            b[i] = c = nxt[c];    /* @b_dead */
            b[i] = c = nxt[c];    /* @b_kill */
        }
        for (long i = 0; i < N; i++) sum += rest[i] + b[i]; /* @read */
    }
    teardown(&m);
    printf("heap_remap %ld %ld moved %ld of %ld\n", sum, c, moves, cycles);
    return 3;
}

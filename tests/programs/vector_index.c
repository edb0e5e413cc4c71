/* Vector stores whose bytes fare differently (a structural-index writer, as
 * a JSON parser's): @store writes 4 indexes (16 bytes) at idx + k, one
 * index further each time, so the next store overwrites the last 3 of the 4
 * before anything reads them, and @read reads the first right after that.
 *
 * Exact answer (dead stores, byte level, as the exact mode and DeadSpy
 * count): of each store's 16 bytes, 12 are overwritten unread (dead) and 4
 * are read (used): 75% dead. Both fates come within a few instructions, so
 * no sample outlives its debug register.
 *
 * Half the stores are only 4-byte aligned. A watchpoint covering the first
 * aligned piece of the store (4 bytes there, 8 bytes where it is 8-byte
 * aligned) lets the first access to any of its bytes decide for all 16:
 * 4-byte pieces are always read first (used), 8-byte pieces always half
 * overwritten first (dead, 8 bytes credited), so the store reads 33% dead.
 *
 * Usage: vector_index [rounds]   prints a checksum, exits 3.
 */
#include <emmintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define N 4096

static uint32_t idx[N + 4] __attribute__((aligned(64)));

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 600000;
    uint64_t sum = 0;
    for (long r = 0; r < rounds; r++) {
        for (int k = 0; k < N; k++) {
            __m128i v = _mm_set1_epi32((int)(r + k));
            _mm_storeu_si128((__m128i *)(idx + k), v); /* @store */
            __asm__ volatile("" ::: "memory");
            if (k > 0) sum += idx[k - 1]; /* @read */
        }
    }
    printf("vector_index %llu\n", (unsigned long long)sum);
    return 3;
}

/* 80.0% of the stored bytes are dead, by construction, and most of them
 * are stored by a few instructions: every block clears a 128 KiB table
 * with memset (glibc's `rep stosb` at this size, or its 64-byte vector loop
 * under witch, which asks glibc for it), which the next block's
 * clear overwrites before anything reads it (@clear: dead); every fourth
 * block also stores a 128 KiB buffer with a loop of 8-byte stores (@loop)
 * and reads it all back (@read), so those bytes are used. Per four blocks:
 * 512 KiB dead, 128 KiB used. A sampler that weights accesses by the time
 * they take, or counts a `rep` string as one access, is far off here: the
 * clear is few instructions, little time natively and most of the bytes.
 *
 * Usage: memset_dead [blocks]   prints a checksum, exits 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (128 * 1024)

static unsigned char table[SIZE] __attribute__((aligned(64)));
static uint64_t buf[SIZE / 8];

int main(int argc, char **argv) {
    long blocks = argc > 1 ? atol(argv[1]) : 40000;
    uint64_t sum = 0;
    for (long b = 0; b < blocks; b++) {
        memset(table, (int)b, SIZE); /* @clear */
        /* The compiler must keep every clear: it is told the table may be
         * read here (nothing is). */
        __asm__ volatile("" : : "r"(table) : "memory");
        if (b % 4 == 3) {
            for (long i = 0; i < SIZE / 8; i++) ((volatile uint64_t *)buf)[i] = (uint64_t)(b + i); /* @loop */
            for (long i = 0; i < SIZE / 8; i++) sum += ((volatile uint64_t *)buf)[i];            /* @read */
        }
    }
    printf("memset_dead %llu\n", (unsigned long long)sum);
    return 0;
}

/* An allocation-heavy workload for the cost of heap tracking: a working set
 * of 256 blocks, one replaced at every step (malloc, calloc or realloc; a
 * third of them 4 KiB to 64 KiB, the rest 16 bytes to 2 KiB), each written
 * sparsely and read back: about 4 million allocation calls a run.
 *
 * Usage: alloc_heavy [steps]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SET 256

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 2000000;
    unsigned char *block[SET] = {0};
    size_t size[SET] = {0};
    unsigned long x = 88172645463325252UL, sum = 0;
    for (long s = 0; s < steps; s++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int i = x % SET;
        size_t n = (x >> 8) % 3 == 0 ? 4096 + (x >> 16) % 61440 : 16 + (x >> 16) % 2032;
        if (block[i] && (x >> 40) % 4 == 0) {
            block[i] = realloc(block[i], n);
        } else {
            free(block[i]);
            block[i] = (x >> 40) % 4 == 1 ? calloc(1, n) : malloc(n);
        }
        if (!block[i]) return 1;
        size[i] = n;
        /* Touch the block sparsely, as a program filling a header would. */
        for (size_t k = 0; k < n; k += 512) block[i][k] = (unsigned char)s;
        sum += block[i][0] + block[i][n - 1];
    }
    for (int i = 0; i < SET; i++) free(block[i]);
    printf("alloc_heavy %lu\n", sum);
    return 0;
}

/* Allocation in a loop: each round takes a block from malloc, fills it,
 * sums it and gives it back, with calloc and realloc now and then. The
 * exact mode judges the C library's allocator's own accesses as the
 * program's (the ptrace mode steps them; DeadSpy counts them), and a
 * call into it from recorded code needs no trap to come back.
 *
 * Usage: exact_malloc [rounds]   prints the sum, exits 4.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 20000;
    unsigned long sum = 0;
    for (long r = 0; r < rounds; r++) {
        size_t n = 32 + (size_t)(r % 7) * 16;
        unsigned char *p = (r % 5 == 0) ? calloc(n, 1) : malloc(n);
        if (!p) return 1;
        memset(p, (int)(r & 0xff), n); /* @fill */
        if (r % 11 == 0) {
            p = realloc(p, n * 2);
            if (!p) return 1;
        }
        for (size_t i = 0; i < n; i++) sum += p[i];
        free(p);
    }
    printf("%lu\n", sum);
    return 4;
}

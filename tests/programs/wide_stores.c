/* Wide (vector) stores whose elements fare differently. Each round clears
 * a 64 KiB block with the C library's memset (vector stores of 32 or 64
 * bytes), then @mark writes the first byte of every 64-byte line with a
 * value that changes each round.
 *
 * Exact answer (silent stores, byte values, as the exact mode counts): of
 * each line the memset writes, 63 bytes are rewritten with the zero they
 * held (silent) and 1 byte, the one @mark changed, is not; every @mark
 * store changes its byte. Silent: 63 of 65 bytes per line, 96.9%.
 *
 * A debug register watches at most 8 bytes of a 64-byte store. Watching
 * always the first 8 would find @mark's change in every line and call the
 * whole memset useful (0% silent); an element chosen at random finds it as
 * often as it happens: in one of each line's eight elements.
 *
 * Usage: wide_stores [rounds]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N (1 << 16)

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    char *buf = aligned_alloc(64, N);
    if (!buf) return 1;
    void *(*volatile clear)(void *, int, size_t) = memset; /* the library's, not inlined */
    for (long r = 0; r < rounds; r++) {
        clear(buf, 0, N);
        for (long i = 0; i < N; i += 64) buf[i] = (char)(r | 1); /* @mark */
    }
    printf("wide_stores %d\n", buf[0]);
    free(buf);
    return 0;
}

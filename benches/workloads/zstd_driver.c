/* Compressor workload: compresses a generated pseudo-text buffer with the
 * zstd library (built from source) at level 3, decompresses it, checks the
 * round trip and prints sizes and a checksum.
 * Usage: zstd_driver [SIZE [LEVEL [REPS]]]: SIZE in MiB, or KiB with a `k`
 * suffix; REPS repeats the compression and decompression of the same buffer
 * (benches/accuracy.py's steady state: two exact runs differing in REPS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zstd.h"

static unsigned long long rng = 0xDEADBEEFCAFEF00DULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static const char *words[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
    "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
    "memory", "store", "load", "profiler", "sample", "watchpoint", "register", "value",
    "program", "context", "calling", "redundant", "silent", "dead", "operation", "waste",
    "function", "compiler", "optimization", "instruction", "address", "buffer", "table",
    "pointer", "structure", "benchmark", "overhead", "accuracy", "precise", "hardware",
};

static void fill_text(unsigned char *buf, size_t len) {
    size_t nwords = sizeof words / sizeof *words, pos = 0, col = 0;
    while (pos < len) {
        /* skewed choice: common words far more often, like real text */
        unsigned long long r = next_rand();
        size_t w = (size_t)((r % nwords) * ((r >> 32) % nwords) / nwords);
        const char *s = words[w];
        size_t l = strlen(s);
        if ((r >> 20) % 53 == 0) { /* a number now and then */
            char num[24];
            l = (size_t)sprintf(num, "%llu", (r >> 40) % 100000);
            for (size_t i = 0; i < l && pos < len; i++) buf[pos++] = (unsigned char)num[i];
        } else {
            for (size_t i = 0; i < l && pos < len; i++) buf[pos++] = (unsigned char)s[i];
        }
        col += l + 1;
        if (pos < len) {
            char sep = ' ';
            if ((r >> 8) % 17 == 0) sep = ',';
            if (col > 72) { sep = '\n'; col = 0; }
            buf[pos++] = (unsigned char)sep;
        }
    }
}

static unsigned long long fnv1a(const unsigned char *p, size_t n) {
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h;
}

int main(int argc, char **argv) {
    char *unit = NULL;
    size_t len = argc > 1 ? (size_t)strtoul(argv[1], &unit, 10) : 32;
    len <<= (unit && *unit == 'k') ? 10 : 20;
    int level = argc > 2 ? atoi(argv[2]) : 3;
    long reps = argc > 3 ? atol(argv[3]) : 1;
    unsigned char *src = malloc(len), *back = malloc(len);
    size_t cap = ZSTD_compressBound(len);
    unsigned char *dst = malloc(cap);
    if (!src || !back || !dst) return 1;
    fill_text(src, len);
    size_t csize = 0, dsize = 0;
    for (long r = 0; r < reps; r++) {
        csize = ZSTD_compress(dst, cap, src, len, level);
        if (ZSTD_isError(csize)) { fprintf(stderr, "compress: %s\n", ZSTD_getErrorName(csize)); return 1; }
        dsize = ZSTD_decompress(back, len, dst, csize);
        if (ZSTD_isError(dsize)) { fprintf(stderr, "decompress: %s\n", ZSTD_getErrorName(dsize)); return 1; }
        if (dsize != len || memcmp(src, back, len) != 0) { fprintf(stderr, "round trip mismatch\n"); return 1; }
    }
    printf("zstd %s level=%d in=%zu out=%zu ratio=%.3f csum=%016llx dsum=%016llx\n", ZSTD_versionString(),
           level, len, csize, (double)len / csize, fnv1a(dst, csize), fnv1a(back, dsize));
    free(src); free(back); free(dst);
    return 0;
}

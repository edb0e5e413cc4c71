/* Two dead stores per iteration, equal in number and size: @cheap after
 * cheap arithmetic, @costly right after a load that misses the caches (a
 * pointer chase through a random cycle of 64 MiB). Each is overwritten by
 * the next round before anything reads it, so the exact answer, within
 * main, is half of the dead bytes at each line.
 *
 * A time-proportional sampler lands where the time goes: on @costly,
 * stalled on its load. A count-proportional one sees both stores equally
 * often. (The loop body is a few instructions, so a burst of single steps
 * covers whole iterations wherever it starts.)
 *
 * Usage: cheap_costly [rounds]   prints a checksum, exits 0.
 */
#include <stdio.h>
#include <stdlib.h>

#define M 64
#define CHASE (8L << 20)

static volatile long a[M], b[M];

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 40000;
    long *nxt = malloc(CHASE * sizeof *nxt);
    if (!nxt) return 1;
    /* One random cycle through every slot (Sattolo's shuffle, fixed seed). */
    for (long i = 0; i < CHASE; i++) nxt[i] = i;
    unsigned long s = 88172645463325252UL;
    for (long i = CHASE - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        long j = (long)(s % (unsigned long)i), t = nxt[i];
        nxt[i] = nxt[j], nxt[j] = t;
    }
    long c = 0;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < M; i++) {
            a[i] = r + i; /* @cheap */
            c = nxt[c];
            b[i] = c; /* @costly */
        }
    }
    long sum = 0;
    for (long i = 0; i < M; i++) sum += a[i] ^ b[i];
    printf("cheap_costly %ld\n", sum);
    free(nxt);
    return 0;
}

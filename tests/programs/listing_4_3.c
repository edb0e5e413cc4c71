/* Listing 4.3 of the Witch chapter: sparse and dense monitoring in one nest.
 *
 *   @L3 : the i loop stores array[i]; killed by the j loop's store (@L11)
 *   @L7 : *p = ...; killed at once by *q (@L8), since p and q alias
 *   @L8 : *q = ...; killed by *p (@L7) in the next k iteration
 *   @L11: the j loop stores array[j]; killed by the next pass's i loop (@L3)
 *
 * Every statement executes N times per pass and costs the same time (one L1
 * load latency of the pointer chase c = nxt[c]), so a time-driven sampler
 * lands on each of the four stores equally often.  Expected waste shares:
 * 25% each for <L3,L11> <L11,L3> <L7,L8> <L8,L7>.  Watchpoints armed at L7
 * and L8 trap almost at once (dense), those armed at L3 and L11 trap a whole
 * pass later (sparse); only proportional attribution (section 4.4.2) gives
 * the right shares.
 *
 * Usage: listing_4_3 [passes]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 18)
#define M 1024

static volatile long array[N];
static volatile long cell[2];
static volatile long nxt[M];

/* Returns &cell[0]; the compiler cannot see that p and q alias. */
__attribute__((noipa)) static volatile long *pick(int argc) { return &cell[argc > 1000]; }

/* Never called (c is never negative).  The test for it makes the *q
 * statement start a basic block (a branch target), so a sampler that looks
 * back from the interrupted PC for a skidded store stops there instead of
 * crediting *q's time to the *p store two instructions earlier. */
static long never_count;
__attribute__((noipa)) static void never(void) { never_count++; }

int main(int argc, char **argv) {
    long passes = argc > 1 ? atol(argv[1]) : 250;
    volatile long *p = pick(argc), *q = pick(argc);
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long pass = 0; pass < passes; pass++) {
        for (long i = 0; i < N; i++) array[i] = c = nxt[c]; /* @L3 */
        for (long k = 0; k < N; k++) { *p = c = nxt[c];     /* @L7 */
                                       if (c < 0) never();
                                       *q = c = nxt[c]; }   /* @L8 */
        for (long j = 0; j < N; j++) array[j] = c = nxt[c]; /* @L11 */
    }
    long sum = *p;
    for (long i = 0; i < N; i++) sum += array[i];
    printf("listing_4_3 %ld %ld %ld\n", sum, c, never_count);
    return 3;
}

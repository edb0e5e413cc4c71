/* A busy single-threaded service stand-in for the attach soak: one thread
 * runs rounds of dead_loop.c's loops (every store of the @sw loop is
 * overwritten by the @sk loop before being read) and folds the array into
 * a checksum, checking between rounds (without blocking) whether stdin has
 * closed.  It then prints the rounds and the checksum, which depend only on
 * the number of rounds: an unprofiled run with that many rounds must print
 * the same.  Unlike attach_target.c, the one thread never sits in a system
 * call, so every signal an attach sends lands on busy code.
 *
 * Usage: busy_single ROUNDS   (0: run until stdin closes); exits 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "stdin_closed.h"

#define N (1L << 15)
#define M 1024

static volatile long a[N];
static volatile long nxt[M]; /* pointer chase: one L1 load latency per store */

int main(int argc, char **argv) {
    long limit = argc > 1 ? atol(argv[1]) : 0, round;
    unsigned long sum = 0;
    for (long i = 0; i < M; i++) nxt[i] = (i * 5 + 3) & (M - 1);
    for (round = 0; limit ? round < limit : !stdin_closed(); round++) {
        long c = round & (M - 1);
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @sw */
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @sk */
        unsigned long s = 0;
        for (long i = 0; i < N; i++) s = s * 31 + (unsigned long)a[i];
        sum = sum * 1000003u + s;
    }
    printf("rounds %ld checksum %lu\n", round, sum);
    return 3;
}

/* Redundant loads by construction (LoadCraft).
 *
 * a[] holds a single cycle a[i] = (i + step) mod N; each pass chases it from
 * 0, loading every element once (@load, two dependent loads per line).
 *   redundant_load same    a[] never changes: every load of a[i] reads what
 *                          the previous pass read there: all redundant.
 *   redundant_load change  between passes a store-only loop (@rewrite)
 *                          rewrites a[] with another odd step, so every load
 *                          reads a different value than last pass: none
 *                          redundant.  The rewrite has no loads of its own.
 * Expected: waste fraction >= 90% with pair <@load, @load> for "same",
 * <= 10% for "change".
 *
 * The chase makes each load depend on the one before, so the interrupted PC
 * of a task-clock sample is often the second load of the line (the one
 * right after the load it waits for).  Since d is still live after the
 * second load, gcc gives that load a destination register other than its
 * address register, so after the load (at the trap) its address can still
 * be recomputed from the registers.  An element is always loaded by the
 * same one of the two loads, whatever the step: N is even and steps are odd.
 *
 * Usage: redundant_load same|change [passes]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N (1L << 16)

static volatile long a[N];

int main(int argc, char **argv) {
    int change = argc > 1 && strcmp(argv[1], "change") == 0;
    long passes = argc > 2 ? atol(argv[2]) : 3000;
    long step = 1, sum = 0;
    for (long i = 0; i < N; i++) a[i] = (i + step) & (N - 1);
    for (long pass = 0; pass < passes; pass++) {
        long c = 0, d = 0;
        for (long k = 0; k < N; k += 2) { d = a[c]; c = a[d]; sum += d; } /* @load */
        sum += c;
        if (change) {
            step = 2 * ((pass + 1) % 64) + 1; /* odd, so the chase is one cycle */
            for (long i = 0; i < N; i++) a[i] = (i + step) & (N - 1); /* @rewrite */
        }
    }
    printf("redundant_load %s %ld\n", change ? "change" : "same", sum);
    return 3;
}

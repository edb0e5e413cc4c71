/* Silent stores by construction (SilentCraft).
 *
 *   silent_store same    every rep stores exactly the values the previous rep
 *                        stored at the same addresses: all silent.
 *   silent_store change  every rep starts the chase one step further, so
 *                        each a[i] gets a different value than last rep:
 *                        no store is silent.
 * Both modes run the very same store instruction (@store); only the start of
 * the pointer chase differs.  Expected: waste fraction >= 90% with pair
 * <@store, @store> for "same", <= 10% for "change".
 *
 * Usage: silent_store same|change [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N (1L << 18)
#define M 1024

static volatile long a[N];
static volatile long nxt[M];

int main(int argc, char **argv) {
    int change = argc > 1 && strcmp(argv[1], "change") == 0;
    long reps = argc > 2 ? atol(argv[2]) : 1000;
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = 0;
    for (long rep = 0; rep < reps; rep++) {
        c = change ? rep & (M - 1) : 0;
        for (long i = 0; i < N; i++) a[i] = c = nxt[c]; /* @store */
    }
    long sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    printf("silent_store %s %ld %ld\n", change ? "change" : "same", sum, c);
    return 3;
}

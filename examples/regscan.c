/* A bundled example for witch, after Listing 4.1 of the Witch paper (SPEC
 * CPU2006 gcc, loop_regs_scan): a large table is zeroed at the end of every
 * basic block although each block touches only a couple of its entries.
 * Almost every byte memset writes is overwritten by the next memset before
 * anyone reads it: dead stores, found by `witch dead`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUM_REGS 16384

struct insn { int reg; int is_set; };

/* Record the last instruction that set each register. */
static void count_one_set(const struct insn *insn, long *last_set, long idx) {
    if (insn->is_set)
        last_set[insn->reg] = idx;
}

static long loop_regs_scan(const struct insn *insns, long n, int block_len) {
    long *last_set = calloc(NUM_REGS, sizeof *last_set);
    long uses = 0;
    for (long i = 0; i < n; i++) {
        count_one_set(&insns[i], last_set, i);
        if (last_set[insns[i].reg] == i)
            uses++;
        if (i % block_len == block_len - 1)            /* end of basic block */
            memset(last_set, 0, NUM_REGS * sizeof *last_set);
    }
    free(last_set);
    return uses;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 4000000;
    struct insn *insns = malloc(n * sizeof *insns);
    unsigned s = 12345;
    for (long i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        insns[i].reg = (s >> 8) % NUM_REGS;
        insns[i].is_set = (s >> 4) & 1;
    }
    printf("uses: %ld\n", loop_regs_scan(insns, n, 8));
    free(insns);
    return 0;
}

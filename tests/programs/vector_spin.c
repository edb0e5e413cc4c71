/* A target whose one thread keeps values live in all sixteen AVX registers
 * (ymm0-ymm15, upper halves included) while it spins, and checks them
 * after each spin: an attach that stops it mid-spin, runs the agent's
 * loading on it (whose memcpy and strlen use those registers) and lets it
 * go must give every register back.  Between spins it checks (without
 * blocking) whether stdin has closed, then prints the spins and how many
 * registers came back changed.
 *
 * Usage: vector_spin   (runs until stdin closes); exits 0 if none changed, 1 otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include "stdin_closed.h"

#define REGS 16

int main(void) {
    uint64_t want[REGS], got[REGS][4];
    long spins = 0, changed = 0;
    for (int r = 0; r < REGS; r++) want[r] = 0x0123456789abcdefULL * (uint64_t)(r + 1) ^ 0x5a5a5a5a00000000ULL;
    while (!stdin_closed()) {
        __asm__ volatile(
#define LOAD(n) "vpbroadcastq " #n "*8(%[w]), %%ymm" #n "\n\t"
            LOAD(0) LOAD(1) LOAD(2) LOAD(3) LOAD(4) LOAD(5) LOAD(6) LOAD(7)
            LOAD(8) LOAD(9) LOAD(10) LOAD(11) LOAD(12) LOAD(13) LOAD(14) LOAD(15)
            "mov $200000, %%ecx\n"
            "1: dec %%ecx\n\t"
            "jnz 1b\n\t"
#define STORE(n) "vmovdqu %%ymm" #n ", " #n "*32(%[g])\n\t"
            STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7)
            STORE(8) STORE(9) STORE(10) STORE(11) STORE(12) STORE(13) STORE(14) STORE(15)
            "vzeroupper\n\t"
            :
            : [w] "r"(want), [g] "r"(got)
            : "rcx", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
              "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
        for (int r = 0; r < REGS; r++)
            for (int l = 0; l < 4; l++) changed += got[r][l] != want[r];
        spins++;
    }
    printf("spins %ld changed %ld\n", spins, changed);
    return changed != 0;
}

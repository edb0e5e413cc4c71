/* A target whose one thread keeps values live in all sixteen AVX registers
 * (ymm0-ymm15, upper halves included) while it spins, and checks them
 * after each spin: an attach that stops it mid-spin, runs the agent's
 * loading on it (whose memcpy and strlen use those registers) and lets it
 * go must give every register back.  Between spins it checks (without
 * blocking) whether stdin has closed, then prints the spins and how many
 * registers came back changed.  Where the processor has AVX-512, every
 * other spin keeps all 32 registers live at full width (zmm0-zmm31) and
 * the mask registers k1-k7 instead.
 *
 * Usage: vector_spin [SPINS]   (runs until stdin closes, making SPINS
 * spins, default 1, between two looks at stdin); exits 0 if none changed,
 * 1 otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include "stdin_closed.h"

#define REGS 16

/* With AVX-512: all 32 registers at full width (zmm0-zmm31) and the mask
 * registers k1-k7, the state the loader's EVEX string functions use. */
__attribute__((target("avx512f,avx512bw"))) static long spin512(const uint64_t *want) {
    static uint64_t got[32][8], mask[8];
    long changed = 0;
    __asm__ volatile(
#define ZLOAD(n) "vpbroadcastq " #n "*8(%[w]), %%zmm" #n "\n\t"
        ZLOAD(0) ZLOAD(1) ZLOAD(2) ZLOAD(3) ZLOAD(4) ZLOAD(5) ZLOAD(6) ZLOAD(7)
        ZLOAD(8) ZLOAD(9) ZLOAD(10) ZLOAD(11) ZLOAD(12) ZLOAD(13) ZLOAD(14) ZLOAD(15)
        ZLOAD(16) ZLOAD(17) ZLOAD(18) ZLOAD(19) ZLOAD(20) ZLOAD(21) ZLOAD(22) ZLOAD(23)
        ZLOAD(24) ZLOAD(25) ZLOAD(26) ZLOAD(27) ZLOAD(28) ZLOAD(29) ZLOAD(30) ZLOAD(31)
#define KLOAD(n) "kmovq " #n "*8(%[w]), %%k" #n "\n\t"
        KLOAD(1) KLOAD(2) KLOAD(3) KLOAD(4) KLOAD(5) KLOAD(6) KLOAD(7)
        "mov $200000, %%ecx\n"
        "1: dec %%ecx\n\t"
        "jnz 1b\n\t"
#define ZSTORE(n) "vmovdqu64 %%zmm" #n ", " #n "*64(%[g])\n\t"
        ZSTORE(0) ZSTORE(1) ZSTORE(2) ZSTORE(3) ZSTORE(4) ZSTORE(5) ZSTORE(6) ZSTORE(7)
        ZSTORE(8) ZSTORE(9) ZSTORE(10) ZSTORE(11) ZSTORE(12) ZSTORE(13) ZSTORE(14) ZSTORE(15)
        ZSTORE(16) ZSTORE(17) ZSTORE(18) ZSTORE(19) ZSTORE(20) ZSTORE(21) ZSTORE(22) ZSTORE(23)
        ZSTORE(24) ZSTORE(25) ZSTORE(26) ZSTORE(27) ZSTORE(28) ZSTORE(29) ZSTORE(30) ZSTORE(31)
#define KSTORE(n) "kmovq %%k" #n ", " #n "*8(%[m])\n\t"
        KSTORE(1) KSTORE(2) KSTORE(3) KSTORE(4) KSTORE(5) KSTORE(6) KSTORE(7)
        "vzeroupper\n\t"
        :
        : [w] "r"(want), [g] "r"(got), [m] "r"(mask)
        : "rcx", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k1", "k2", "k3", "k4", "k5",
          "k6", "k7");
    for (int r = 0; r < 32; r++)
        for (int l = 0; l < 8; l++) changed += got[r][l] != want[r];
    for (int k = 1; k < 8; k++) changed += mask[k] != want[k];
    return changed;
}

#include <stdlib.h>

int main(int argc, char **argv) {
    uint64_t want[32], got[REGS][4];
    long spins = 0, changed = 0, between = argc > 1 ? atol(argv[1]) : 1;
    if (between < 1) between = 1;
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    for (int r = 0; r < 32; r++) want[r] = 0x0123456789abcdefULL * (uint64_t)(r + 1) ^ 0x5a5a5a5a00000000ULL;
    for (long k = 0; k % between || !stdin_closed(); k++) {
        if (avx512 && spins % 2) {
            changed += spin512(want);
            spins++;
            continue;
        }
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

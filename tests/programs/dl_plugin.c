/* A plugin for dl_host.c and dl_churn.c, built as a shared library with
 * `-shared -fPIC`: dead stores by construction, as in dead_loop.c (every
 * store of the first loop is overwritten by the second before anything
 * reads it, and the second's by the next rep's first, except the last).
 *
 * Built twice: libdl_plugin_a.so (default: loops @aw/@ak) and
 * libdl_plugin_b.so (-DPLUGIN_B: loops @bw/@bk). Both span the same number
 * of pages (a 2 MB table each), so the loader maps B exactly where A was
 * once A is unloaded; B's code starts with another function, so the same
 * addresses hold other code: a module map that still describes A puts B's
 * samples in A's functions and lines.
 *
 * plugin_work(a, n, reps): the loops over a[0..n), `reps` times; returns a
 * checksum that depends only on n and reps.
 */

#define M 1024

#define PAD(n) \
    __attribute__((used, noinline)) void plugin_pad##n(void) { __asm__ volatile(".fill 16384, 1, 0x90"); }
#define PAD10(n) PAD(n##0) PAD(n##1) PAD(n##2) PAD(n##3) PAD(n##4) PAD(n##5) PAD(n##6) PAD(n##7) PAD(n##8) PAD(n##9)

#ifdef PLUGIN_PAD
/* dl_churn's builds: A with -DPLUGIN_PAD (no table: 2.5 MB of code, 160
 * functions of 16 KB, then its unwind tables), B with -DPLUGIN_B_PAD (64
 * KB of code before its own, then its 2 MB table). Both are mapped at the
 * same address: B's code lies where A's padding was, and where A's unwind
 * tables were, past B's end, nothing is mapped. A stale map unwinds B's
 * code with A's tables. */
static const char plugin_table[1] = {1};
PAD10(1) PAD10(2) PAD10(3) PAD10(4) PAD10(5) PAD10(6) PAD10(7) PAD10(8)
PAD10(9) PAD10(10) PAD10(11) PAD10(12) PAD10(13) PAD10(14) PAD10(15) PAD10(16)
#else
const char plugin_table[2 << 20] = {1};
#endif
#ifdef PLUGIN_B_PAD
PAD(1) PAD(2) PAD(3) PAD(4)
#endif

#ifndef PLUGIN_B

long plugin_work(volatile long *a, long n, long reps) {
    volatile long nxt[M]; /* pointer chase: one L1 load latency per store */
    for (long i = 0; i < M; i++) nxt[i] = (i + 1) & (M - 1);
    long c = plugin_table[0];
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @aw */
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @ak */
    }
    long sum = 0;
    for (long i = 0; i < n; i++) sum += a[i];
    return sum + c;
}
#else
/* Code before plugin_work: B's loops are where A's were not. */
__attribute__((noinline)) long plugin_mix(long x) {
    for (int i = 0; i < 16; i++) x = x * 6364136223846793005L + 1442695040888963407L + (x >> 7);
    return x;
}

long plugin_work(volatile long *a, long n, long reps) {
    volatile long nxt[M];
    for (long i = 0; i < M; i++) nxt[i] = (i + 3) & (M - 1);
    long c = plugin_table[0] - 1;
    for (long rep = 0; rep < reps; rep++) {
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @bw */
        for (long i = 0; i < n; i++) a[i] = c = nxt[c]; /* @bk */
    }
    long sum = 0;
    for (long i = 0; i < n; i++) sum += 2 * a[i];
    return sum + c + (plugin_mix(n) & 1);
}
#endif

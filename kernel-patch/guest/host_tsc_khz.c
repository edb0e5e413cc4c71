// SPDX-License-Identifier: GPL-2.0
/*
 * The host's TSC frequency in kHz, measured against CLOCK_MONOTONIC over
 * 200 ms. QEMU TCG hands the guest the host's TSC, but the guest kernel
 * cannot calibrate it (no usable PIT or HPET timing under emulation) and
 * falls back to jiffies; boot-test.sh passes this as tsc_early_khz.
 */
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double ns_since(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (b.tv_sec - a->tv_sec) * 1e9 + (b.tv_nsec - a->tv_nsec);
}

int main(void)
{
	struct timespec a;
	unsigned long long t0, t1;
	double ns;

	clock_gettime(CLOCK_MONOTONIC, &a);
	t0 = __rdtsc();
	while (ns_since(&a) < 2e8)
		;
	t1 = __rdtsc();
	ns = ns_since(&a);
	printf("%.0f\n", (t1 - t0) / ns * 1e6);
	return 0;
}

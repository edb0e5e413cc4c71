/* Half of the stored bytes come from an inlined `rep stosb`, half from a
 * loop of 8-byte stores. The rep's bytes are dead (stored again next round
 * before any read); the loop's are used (summed after each round). So
 * exactly half of the stored bytes are dead. An armed watchpoint turns off
 * fast strings, so under a profiler the rep takes far more of the time than
 * its share of the stores. Usage: rep_vs_loop BYTES ROUNDS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char a[1 << 16] __attribute__((aligned(64)));
static uint64_t b[1 << 13];

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 4096, rounds = argc > 2 ? atol(argv[2]) : 1000;
	uint64_t sum = 0;

	if (n < 8 || n > (long)sizeof(a))
		return 2;
	for (long r = 0; r < rounds; r++) {
		void *p = a;
		long c = n;
		__asm__ volatile("rep stosb" : "+D"(p), "+c"(c) : "a"((int)r) : "memory"); /* @rep */
		for (long i = 0; i < n / 8; i++)
			((volatile uint64_t *)b)[i] = (uint64_t)r + i; /* @loop */
		for (long i = 0; i < n / 8; i++)
			sum += ((volatile uint64_t *)b)[i];
	}
	printf("%llu %u\n", (unsigned long long)sum, a[n - 1]);
	return 0;
}

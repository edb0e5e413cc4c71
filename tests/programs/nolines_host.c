/* The program around nolines_lib.c, built without line info: it spends
 * its time in the library's two functions.
 *
 * Usage: nolines_host [reps]   prints a checksum, exits 3.
 */
#include <stdio.h>
#include <stdlib.h>

void scrub_table(char *t, unsigned long n);
void stamp_table(long *a, unsigned long n, long v);

static char t[1 << 16];
static long a[1 << 13];

int main(int argc, char **argv)
{
	long reps = argc > 1 ? atol(argv[1]) : 6000;
	for (long r = 0; r < reps; r++) {
		scrub_table(t, sizeof t);
		stamp_table(a, sizeof a / sizeof a[0], r);
	}
	printf("nolines %d %ld\n", t[7], a[5]);
	return 3;
}

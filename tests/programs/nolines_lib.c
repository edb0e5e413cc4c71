/* A library of the program's own, built without line info (-g0), as a
 * distribution's libraries come without their debug packages: its code
 * clears a table with memset and stamps another, each overwritten before
 * anything reads it.  With the C library's debug info installed, memset
 * and the C library's start-up code have source lines and this library
 * has none; the report must still blame this library's functions.
 * Built by tests/tests/sites.rs with nolines_host.c.
 */
#include <string.h>

void scrub_table(char *t, unsigned long n)
{
	memset(t, 0, n);
	memset(t, 1, n);
	/* Code after the call: memset is called, not jumped to (a tail call
	 * would leave scrub_table out of memset's calling context). */
	__asm__ volatile("" ::: "memory");
}

void stamp_table(long *a, unsigned long n, long v)
{
	for (unsigned long i = 0; i < n; i++)
		a[i] = v;
	__asm__ volatile("" ::: "memory");
	for (unsigned long i = 0; i < n; i++)
		a[i] = v + 1;
}

/* Prints how the C library's heap is laid out for this program: what its
 * main arena holds when main begins, and where blocks of a few sizes land
 * (offsets from the first block, and the first block's offset in its
 * page), before and after it freed some. Natively the
 * output is the same every run (address randomization moves the heap by
 * whole pages); under witch it must be the same as natively: the program's
 * heap is the program's. (Single-threaded: a thread's creation allocates
 * its thread-local storage vector from this heap, one entry longer with
 * any library that has thread-local storage loaded, witch's agent
 * included; that is the one difference the agent's presence makes.) */
#include <malloc.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

int main(void) {
    struct mallinfo2 m = mallinfo2();
    printf("at main: arena=%zu inuse=%zu free=%zu blocks=%zu mapped=%zu\n", m.arena, m.uordblks, m.fordblks, m.ordblks, m.hblks);
    static const size_t sizes[] = {24, 100, 472, 120, 1024, 240, 32, 152, 4096, 84856};
    char *first = malloc(16);
    printf("first block at page offset %#lx\n", (unsigned long)((uintptr_t)first & 4095));
    void *keep[32];
    int n = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        keep[n] = malloc(sizes[i]);
        printf("%zu bytes at first%+ld\n", sizes[i], (long)((char *)keep[n] - first));
        n++;
    }
    for (int i = 1; i < n; i += 2)
        free(keep[i]);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i += 3) {
        char *p = malloc(sizes[i] + 8);
        printf("after frees: %zu bytes at first%+ld\n", sizes[i] + 8, (long)(p - first));
        free(p);
    }
    for (int i = 1; i < n; i += 2)
        keep[i] = NULL;
    m = mallinfo2();
    printf("at the end: arena=%zu inuse=%zu\n", m.arena, m.uordblks);
    for (int i = 0; i < n; i++)
        free(keep[i]);
    free(first);
    return 7;
}

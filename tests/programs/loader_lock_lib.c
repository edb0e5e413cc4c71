/* The library loader_lock.c loads: its constructor waits for a byte on the
 * pipe whose read end's number is in LOADER_LOCK_FD. */
#include <stdlib.h>
#include <unistd.h>

int loader_lock_value;

__attribute__((constructor)) static void wait_for_main(void) {
    const char *fd = getenv("LOADER_LOCK_FD");
    char c = 0;
    if (fd)
        while (read(atoi(fd), &c, 1) < 0) {
        }
    loader_lock_value = 42;
}

/* Says which standard descriptors (0, 1, 2) it started with open, and the
 * number its first open() gets (the lowest closed one).
 *
 * Usage: std_fds   prints one line, exits 0.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    int open_fds = 0;
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) != -1) open_fds |= 1 << fd;
    int f = open("/dev/null", O_RDONLY);
    printf("standard descriptors open (bits): %d; the first open gets %d\n", open_fds, f);
    return 0;
}

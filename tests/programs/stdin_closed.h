/* For test programs that run until the test closes their stdin (targets to
 * attach to): has stdin closed? Never blocks. */
#ifndef STDIN_CLOSED_H
#define STDIN_CLOSED_H
#include <poll.h>
#include <unistd.h>

static int stdin_closed(void) {
    struct pollfd p = {0, POLLIN, 0};
    char buf[64];
    return poll(&p, 1, 0) > 0 && read(0, buf, sizeof buf) <= 0;
}
#endif

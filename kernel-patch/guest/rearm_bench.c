// SPDX-License-Identifier: GPL-2.0
/*
 * Re-arm micro-benchmark: the cost of PERF_EVENT_IOC_MODIFY_ATTRIBUTES on a
 * data breakpoint of the calling thread, as a sampling profiler re-arms it.
 *
 *   enabled   re-target an enabled breakpoint (witch's handler path; the one
 *             the in-place patch speeds up), with the other debug registers
 *             armed too, lengths changing as sampled accesses do
 *   disabled  re-target a disabled breakpoint (keeps it disabled)
 *   reopen    close the event and open a new one (the old fallback)
 *   cycle-disable  witch's free + arm on a stock kernel: disable the event
 *             (PERF_EVENT_IOC_DISABLE), later re-target it enabled
 *   cycle-park     witch's free + arm on a kernel that re-targets in place:
 *             re-target it (enabled) to a parking address, later to the next
 *             watched address
 *
 * Prints one line per path: "rearm PATH ns=MEDIAN min=MIN max=MAX rounds=R
 * ops=N", the median over R rounds of the mean time of N operations (the
 * rounds of all paths interleave), and "rearm enabled-per-disabled
 * ratio=X": the median over rounds of the enabled re-arm's time divided by
 * the disabled one's of the same round. Absolute numbers under an emulator
 * mean little: compare two kernels by the ratio of their medians on the
 * same machine; the disabled re-arm runs the same code in both kernels, so
 * the enabled-per-disabled ratios of two kernels compare them in units
 * that do not change with how fast the emulator ran each boot.
 *
 * Usage: rearm_bench [ROUNDS [OPS]]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#define SLOTS 4

static volatile uint64_t buf[64] __attribute__((aligned(64)));

static struct perf_event_attr attr_at(volatile void *addr, int len, int disabled)
{
	struct perf_event_attr a;

	memset(&a, 0, sizeof(a));
	a.type = PERF_TYPE_BREAKPOINT;
	a.size = sizeof(a);
	a.bp_type = HW_BREAKPOINT_W;
	a.bp_addr = (unsigned long)addr;
	a.bp_len = len;
	a.sample_period = 1;
	a.wakeup_events = 1;
	a.disabled = disabled;
	a.exclude_kernel = 1;
	a.exclude_hv = 1;
	return a;
}

static int open_bp(volatile void *addr, int len, int disabled)
{
	struct perf_event_attr a = attr_at(addr, len, disabled);
	int fd = syscall(__NR_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);

	if (fd < 0) {
		fprintf(stderr, "rearm_bench: perf_event_open: %s\n", strerror(errno));
		exit(2);
	}
	return fd;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Where operation i points the breakpoint: 8-aligned, length 1/2/4/8. */
static volatile void *target(long i, int *len)
{
	static const int lens[] = { 8, 4, 8, 2, 8, 1, 4, 8 };

	*len = lens[i % 8];
	return &buf[8 + (i % 32)];
}

static double round_enabled(int *fds, long ops)
{
	double t0 = now_ns();

	for (long i = 0; i < ops; i++) {
		int len;
		volatile void *p = target(i, &len);
		struct perf_event_attr a = attr_at(p, len, 0);

		if (ioctl(fds[i % SLOTS], PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a)) {
			perror("rearm_bench: modify (enabled)");
			exit(2);
		}
	}
	return (now_ns() - t0) / ops;
}

static double round_disabled(int *fds, long ops)
{
	double t0 = now_ns();

	for (long i = 0; i < ops; i++) {
		int len;
		volatile void *p = target(i, &len);
		struct perf_event_attr a = attr_at(p, len, 1);

		if (ioctl(fds[i % SLOTS], PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a)) {
			perror("rearm_bench: modify (disabled)");
			exit(2);
		}
	}
	return (now_ns() - t0) / ops;
}

static double round_reopen(int *fds, long ops)
{
	double t0 = now_ns();

	for (long i = 0; i < ops; i++) {
		int len;
		volatile void *p = target(i, &len);

		close(fds[i % SLOTS]);
		fds[i % SLOTS] = open_bp(p, len, 0);
	}
	return (now_ns() - t0) / ops;
}

static double round_cycle_disable(int *fds, long ops)
{
	double t0 = now_ns();

	for (long i = 0; i < ops; i++) {
		int len;
		volatile void *p = target(i, &len);
		struct perf_event_attr a = attr_at(p, len, 0);
		int fd = fds[i % SLOTS];

		if (ioctl(fd, PERF_EVENT_IOC_DISABLE, 0) ||
		    ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a)) {
			perror("rearm_bench: disable + modify");
			exit(2);
		}
	}
	return (now_ns() - t0) / ops;
}

static double round_cycle_park(int *fds, long ops)
{
	double t0 = now_ns();

	for (long i = 0; i < ops; i++) {
		int len;
		volatile void *p = target(i, &len);
		struct perf_event_attr park = attr_at(&buf[63], 8, 0);
		struct perf_event_attr a = attr_at(p, len, 0);
		int fd = fds[i % SLOTS];

		if (ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &park) ||
		    ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a)) {
			perror("rearm_bench: park + modify");
			exit(2);
		}
	}
	return (now_ns() - t0) / ops;
}

struct path {
	const char *name;
	double (*fn)(int *fds, long ops);
	int disabled;
	long ops;
	double *t;
};

/* One timed round of @p on four fresh breakpoints of this thread. */
static double round_of(struct path *p)
{
	int fds[SLOTS];
	double t;

	for (int s = 0; s < SLOTS; s++)
		fds[s] = open_bp(&buf[s], 8, p->disabled);
	p->fn(fds, p->ops / 10 + 1);	/* warm up */
	t = p->fn(fds, p->ops);
	for (int s = 0; s < SLOTS; s++)
		close(fds[s]);
	return t;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp);
	return v[n / 2];
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 9;
	long ops = argc > 2 ? atol(argv[2]) : 2000;
	struct path paths[] = {
		{ .name = "enabled", .fn = round_enabled, .disabled = 0, .ops = ops },
		{ .name = "disabled", .fn = round_disabled, .disabled = 1, .ops = ops },
		{ .name = "reopen", .fn = round_reopen, .disabled = 0, .ops = ops / 4 + 1 },
		{ .name = "cycle-disable", .fn = round_cycle_disable, .disabled = 0, .ops = ops / 2 + 1 },
		{ .name = "cycle-park", .fn = round_cycle_park, .disabled = 0, .ops = ops / 2 + 1 },
	};
	int n = sizeof(paths) / sizeof(paths[0]);
	double *per_disabled;

	if (rounds < 1 || ops < 1) {
		fprintf(stderr, "usage: rearm_bench [ROUNDS [OPS]]\n");
		return 2;
	}
	per_disabled = calloc(rounds, sizeof(*per_disabled));
	for (int i = 0; i < n; i++)
		paths[i].t = calloc(rounds, sizeof(double));
	/*
	 * Rounds of the paths interleave, so that a change in the machine's
	 * speed during the run (an emulator sharing a busy host) falls on all
	 * of them alike; enabled/disabled of the same round are adjacent.
	 */
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < n; i++)
			paths[i].t[r] = round_of(&paths[i]);
		per_disabled[r] = paths[0].t[r] / paths[1].t[r];
	}
	for (int i = 0; i < n; i++) {
		struct path *p = &paths[i];
		double med = median(p->t, rounds);

		printf("rearm %s ns=%.0f min=%.0f max=%.0f rounds=%d ops=%ld\n",
		       p->name, med, p->t[0], p->t[rounds - 1], rounds, p->ops);
		free(p->t);
	}
	/* The enabled re-arm in units of the disabled one, round by round. */
	printf("rearm enabled-per-disabled ratio=%.3f rounds=%d\n",
	       median(per_disabled, rounds), rounds);
	fflush(stdout);
	free(per_disabled);
	return 0;
}

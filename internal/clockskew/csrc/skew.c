// skew.c: an LD_PRELOAD library that moves a C program's wall clock
// (CLOCK_REALTIME, gettimeofday, time) by RB_CLOCK_OFFSET_MS milliseconds,
// leaving the monotonic clocks alone. The tests run redis-server under it: the
// broker's clock is Redis' TIME, so a broker whose clock is an hour off the
// agents' is a real redis-server whose TIME is an hour off.
//
// libfaketime would do the same but deadlocks in redis-server's jemalloc at
// start-up (its initialisation allocates inside clock_gettime); this library
// allocates nothing and calls the kernel directly.
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ns(void) {
	static int read;
	static long long off;
	if (!read) {
		const char *s = getenv("RB_CLOCK_OFFSET_MS");
		off = s ? atoll(s) * 1000000LL : 0;
		read = 1;
	}
	return off;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
	int r = syscall(SYS_clock_gettime, clk, ts);
	if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
		long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	(void)tz;
	struct timespec ts;
	int r = clock_gettime(CLOCK_REALTIME, &ts);
	if (r == 0) { // tv is declared nonnull
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return r;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) {
		*t = ts.tv_sec;
	}
	return ts.tv_sec;
}

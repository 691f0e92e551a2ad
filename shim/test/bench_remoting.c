/*
 * bench_remoting.c: transport figures of the shim against a running remoting server (driven by
 * test/bench/remoting, which starts the server and runs this once per mode).
 *   sync:  round trips of cuCtxSynchronize, one at a time: p50, p99, mean (ns)
 *   async: cuLaunchKernel records (4 pointer-sized arguments) as fast as the shim takes them, then one
 *          cuCtxSynchronize: calls per second including the drain
 * Usage: bench_remoting SYNC_CALLS ASYNC_CALLS. Prints "key value" lines.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int cuInit(unsigned);
int cuCtxSynchronize(void);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
		   void **);

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	long nsync = argc > 1 ? atol(argv[1]) : 100000, nasync = argc > 2 ? atol(argv[2]) : 2000000;
	/* Every synchronize is a round trip: none is answered in the shim after the one before it. */
	setenv("FAAS_GPU_REMOTING_LOCAL_SYNC", "0", 1);
	if (cuInit(0) != 0) return 1;
	uint64_t *lat = malloc(sizeof *lat * (size_t)nsync);
	for (long i = 0; i < 1000; i++) cuCtxSynchronize(); /* warm up */
	uint64_t total = 0;
	for (long i = 0; i < nsync; i++) {
		uint64_t t0 = now_ns();
		if (cuCtxSynchronize() != 0) return 2;
		lat[i] = now_ns() - t0;
		total += lat[i];
	}
	qsort(lat, (size_t)nsync, sizeof *lat, cmp);
	printf("sync_calls %ld\nsync_p50_ns %llu\nsync_p99_ns %llu\nsync_mean_ns %llu\n", nsync,
	       (unsigned long long)lat[nsync / 2], (unsigned long long)lat[nsync * 99 / 100],
	       (unsigned long long)(total / (uint64_t)nsync));

	uint64_t args[4] = {0x7f0000001000ull, 0x7f0000002000ull, 0x7f0000003000ull, 1000};
	size_t size = sizeof args;
	void *extra[] = {(void *)1, args, (void *)2, &size, (void *)0};
	void *f = (void *)0x22;
	uint64_t t0 = now_ns();
	for (long i = 0; i < nasync; i++)
		if (cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, NULL, NULL, extra) != 0) return 3;
	if (cuCtxSynchronize() != 0) return 4;
	uint64_t dt = now_ns() - t0;
	printf("async_calls %ld\nasync_ns %llu\nasync_calls_per_s %.0f\n", nasync, (unsigned long long)dt,
	       (double)nasync * 1e9 / (double)dt);
	return 0;
}

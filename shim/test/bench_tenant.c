/*
 * bench_tenant.c: remoting figures of the shim against a gpuserver whose device handler runs the calls on a
 * simulated GPU (driven by test/bench/tenants, once per mode: sessions run in the gpuserver's own
 * process, or are handed to the tenant's executor process).
 *   sync:  cuCtxSynchronize round trips, one at a time, on a session with a bound stream: p50, p99, mean (ns)
 *   async: cuLaunchKernel of vector_add over 1 element (a reference kernel the simulated GPU computes) as fast as
 *          the shim takes them, then one cuCtxSynchronize: calls per second including the drain; the result is
 *          checked
 * Usage: bench_tenant PTX_FILE SYNC_CALLS ASYNC_CALLS. Prints "key value" lines.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cuInit(unsigned);
int cuDeviceGet(int *, int);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(unsigned long long *, size_t);
int cuMemcpyHtoD_v2(unsigned long long, const void *, size_t);
int cuMemcpyDtoH_v2(void *, unsigned long long, size_t);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
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

#define CHECK(call)                                                                              \
	do {                                                                                     \
		int r_ = (call);                                                                 \
		if (r_ != 0) {                                                                   \
			fprintf(stderr, "bench_tenant: %s: CUDA error %d\n", #call, r_);          \
			return 2;                                                                \
		}                                                                                \
	} while (0)

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: bench_tenant PTX_FILE SYNC_CALLS ASYNC_CALLS\n");
		return 1;
	}
	long nsync = atol(argv[2]), nasync = atol(argv[3]);
	/* Every synchronize is a round trip: none is answered in the shim after the one before it. */
	setenv("FAAS_GPU_REMOTING_LOCAL_SYNC", "0", 1);
	FILE *f = fopen(argv[1], "rb");
	if (f == NULL) return 1;
	static char ptx[1 << 20];
	size_t n = fread(ptx, 1, sizeof ptx - 1, f);
	fclose(f);
	ptx[n] = 0;

	int dev;
	void *ctx, *mod, *fn;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuModuleLoadData(&mod, ptx));
	CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));
	unsigned long long a, c;
	float one = 1.0f, out = 0;
	CHECK(cuMemAlloc_v2(&a, 256));
	CHECK(cuMemAlloc_v2(&c, 256));
	CHECK(cuMemcpyHtoD_v2(a, &one, sizeof one));

	uint64_t *lat = malloc(sizeof *lat * (size_t)nsync);
	for (long i = 0; i < 1000; i++) CHECK(cuCtxSynchronize()); /* warm up */
	uint64_t total = 0;
	for (long i = 0; i < nsync; i++) {
		uint64_t t0 = now_ns();
		CHECK(cuCtxSynchronize());
		lat[i] = now_ns() - t0;
		total += lat[i];
	}
	qsort(lat, (size_t)nsync, sizeof *lat, cmp);
	printf("sync_calls %ld\nsync_p50_ns %llu\nsync_p99_ns %llu\nsync_mean_ns %llu\n", nsync,
	       (unsigned long long)lat[nsync / 2], (unsigned long long)lat[nsync * 99 / 100],
	       (unsigned long long)(total / (uint64_t)nsync));

	unsigned count = 1;
	void *args[] = {&a, &a, &c, &count};
	uint64_t t0 = now_ns();
	for (long i = 0; i < nasync; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	CHECK(cuCtxSynchronize());
	uint64_t dt = now_ns() - t0;
	CHECK(cuMemcpyDtoH_v2(&out, c, sizeof out));
	if (out != 2.0f) {
		fprintf(stderr, "bench_tenant: vector_add computed %g, want 2\n", out);
		return 3;
	}
	printf("async_calls %ld\nasync_ns %llu\nasync_calls_per_s %.0f\n", nasync, (unsigned long long)dt,
	       (double)nasync * 1e9 / (double)dt);
	return 0;
}

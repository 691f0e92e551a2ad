/*
 * replay.c: replays a recorded forward pass (a replay trace, test/bench/replay/trace) through libcuda.so.1 at the
 * recorded issue rate: the shim's when linked as built (test/bench/replay drives it against a gpuserver), or the
 * real driver's with LD_LIBRARY_PATH naming the driver's directory (then it is the native pass on a GPU).
 *
 * Each call of the trace: spin for its gap (the client's own time), make its driver calls answered in the shim
 * (cuCtxGetDevice), then the remoted call itself: a launch of busy(gpu_ns) (the reference kernel that takes that
 * long on the GPU) with an argument buffer padded so that the shim's record has the recorded size, a memset, or
 * the final cuCtxSynchronize.
 *
 * Usage: replay TRACE PTX. Prints "ready" after setup, then answers one line per command on stdin:
 *   pass       run one pass: "pass wall_ns issue_ns remoted_ns local_ns cpu_ns start_ns" (the pass, until the
 *              synchronize's call, inside remoted calls, inside local calls, process CPU; when it started, in
 *              CLOCK_MONOTONIC)
 *   model      run one pass of the native model instead, on this machine in real time, calling no driver: the same
 *              gaps spun, each driver call spun for the trace's native cost (native_local_ns, native_call_ns), the
 *              GPU's end kept as the trace's model says (each call's work starts when it is issued or when the
 *              previous work ended), the synchronize spun until the GPU's end plus native_sync_ns. Same answer as
 *              pass. Interleaved with shim passes it puts the native side under the same machine as the shim's.
 *   log PATH   the next pass writes the shim's call log to PATH (faasGpuShimCallLog): "log ok"
 *   quit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cuInit(unsigned);
int cuDeviceGet(int *, int);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuCtxGetDevice(int *);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuMemAlloc_v2(unsigned long long *, size_t);
int cuMemsetD8Async(unsigned long long, unsigned char, size_t, void *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
		   void **);

struct launch_attr {
	uint32_t id, pad;
	uint8_t value[64];
};
struct launch_config {
	unsigned grid[3], block[3], shmem;
	void *stream;
	struct launch_attr *attrs;
	unsigned num_attrs;
};
int cuLaunchKernelEx(const struct launch_config *, void *, void **, void **);

enum { LAUNCH, LAUNCH_EX, MEMSET, SYNC };

struct call {
	int kind;
	uint64_t gap, gpu;
	unsigned local, bytes;
};

/* Record sizes of the shim's encoders (shim/src/calls_gen.c): a launch is 104 bytes plus its padded arguments, a
 * launch with attributes 120 plus 72 per attribute plus its padded arguments. */
#define LAUNCH_FIXED 104u
#define LAUNCH_EX_FIXED (120u + 72u)
#define ARGS_MAX 32760u

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int r) {
	fprintf(stderr, "replay: %s: %d\n", what, r);
	exit(1);
}

/* The native driver's constants of the trace's header. */
static uint64_t native_call, native_local, native_sync;

static struct call *read_trace(const char *path, size_t *n) {
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		perror(path);
		exit(1);
	}
	size_t cap = 1024;
	struct call *calls = malloc(cap * sizeof *calls);
	char line[512], name[64];
	*n = 0;
	while (fgets(line, sizeof line, f) != NULL) {
		unsigned long long v;
		if (sscanf(line, "# native_call_ns %llu", &v) == 1) native_call = v;
		if (sscanf(line, "# native_local_ns %llu", &v) == 1) native_local = v;
		if (sscanf(line, "# native_sync_ns %llu", &v) == 1) native_sync = v;
		if (line[0] == '#' || line[0] == '\n') continue;
		struct call c;
		unsigned long long gap, gpu;
		if (sscanf(line, "%63s %llu %u %llu %u", name, &gap, &c.local, &gpu, &c.bytes) != 5) {
			fprintf(stderr, "replay: %s: bad line %s", path, line);
			exit(1);
		}
		c.gap = gap;
		c.gpu = gpu;
		if (strcmp(name, "cuLaunchKernel") == 0)
			c.kind = LAUNCH;
		else if (strcmp(name, "cuLaunchKernelEx") == 0)
			c.kind = LAUNCH_EX;
		else if (strcmp(name, "cuMemsetD8Async") == 0)
			c.kind = MEMSET;
		else if (strcmp(name, "cuCtxSynchronize") == 0)
			c.kind = SYNC;
		else {
			fprintf(stderr, "replay: %s: call %s\n", path, name);
			exit(1);
		}
		if (*n == cap) calls = realloc(calls, (cap *= 2) * sizeof *calls);
		calls[(*n)++] = c;
	}
	fclose(f);
	if (*n == 0 || calls[*n - 1].kind != SYNC) {
		fprintf(stderr, "replay: %s: the pass must end with cuCtxSynchronize\n", path);
		exit(1);
	}
	return calls;
}

static char *read_file(const char *path) {
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = calloc(1, (size_t)size + 1);
	if (fread(buf, 1, (size_t)size, f) != (size_t)size) die("read PTX", 0);
	fclose(f);
	return buf;
}

/* args_size is the argument buffer that makes the shim's record bytes long (at least busy's 8 bytes); natively the
 * driver gets exactly busy's. */
static size_t args_size(unsigned bytes, unsigned fixed, int native) {
	if (native || bytes < fixed + 8) return 8;
	size_t n = bytes - fixed;
	return n > ARGS_MAX ? ARGS_MAX : n;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: replay TRACE PTX\n");
		return 2;
	}
	size_t ncalls;
	struct call *calls = read_trace(argv[1], &ncalls);
	int (*calllog)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "faasGpuShimCallLog");
	int native = calllog == NULL;
	int dev, r;
	void *ctx, *mod, *busy;
	if ((r = cuInit(0)) != 0) die("cuInit", r);
	if ((r = cuDeviceGet(&dev, 0)) != 0) die("cuDeviceGet", r);
	if ((r = cuDevicePrimaryCtxRetain(&ctx, dev)) != 0) die("cuDevicePrimaryCtxRetain", r);
	if ((r = cuCtxSetCurrent(ctx)) != 0) die("cuCtxSetCurrent", r);
	char *ptx = read_file(argv[2]);
	if ((r = cuModuleLoadData(&mod, ptx)) != 0) die("cuModuleLoadData", r);
	if ((r = cuModuleGetFunction(&busy, mod, "busy")) != 0) die("cuModuleGetFunction busy", r);
	unsigned long long buf;
	if ((r = cuMemAlloc_v2(&buf, 1 << 16)) != 0) die("cuMemAlloc", r);
	if ((r = cuCtxSynchronize()) != 0) die("cuCtxSynchronize", r);
	static uint8_t args[ARGS_MAX + 8];
	struct launch_attr attr;
	memset(&attr, 0, sizeof attr); /* CU_LAUNCH_ATTRIBUTE_IGNORE */
	printf("ready %s\n", native ? "native" : "shim");
	fflush(stdout);

	char cmd[4200];
	const char *logpath = NULL;
	char logbuf[sizeof cmd];
	while (fgets(cmd, sizeof cmd, stdin) != NULL) {
		cmd[strcspn(cmd, "\n")] = 0;
		if (strcmp(cmd, "quit") == 0) break;
		if (strncmp(cmd, "log ", 4) == 0) {
			snprintf(logbuf, sizeof logbuf, "%s", cmd + 4);
			logpath = logbuf;
			printf("log %s\n", native ? "unavailable" : "ok");
			fflush(stdout);
			continue;
		}
		if (strcmp(cmd, "model") == 0) {
			uint64_t cpu0 = cpu_ns(), start = now_ns(), t = start, gpu_end = 0, issue = 0, drv = 0, loc = 0;
			for (size_t i = 0; i < ncalls; i++) {
				const struct call *c = &calls[i];
				uint64_t until = t + c->gap + c->local * native_local;
				while (now_ns() < until)
					;
				loc += c->local * native_local;
				if (c->kind == SYNC) {
					issue = now_ns() - start;
					until = (gpu_end > now_ns() ? gpu_end : now_ns()) + native_sync;
					while (now_ns() < until)
						;
					t = now_ns();
					break;
				}
				for (until = now_ns() + native_call; now_ns() < until;)
					;
				drv += native_call;
				t = now_ns();
				gpu_end = (gpu_end > t ? gpu_end : t) + c->gpu;
			}
			printf("pass %llu %llu %llu %llu %llu %llu\n", (unsigned long long)(t - start),
			       (unsigned long long)issue, (unsigned long long)drv, (unsigned long long)loc,
			       (unsigned long long)(cpu_ns() - cpu0), (unsigned long long)start);
			fflush(stdout);
			continue;
		}
		if (strcmp(cmd, "pass") != 0) {
			fprintf(stderr, "replay: unknown command %s\n", cmd);
			return 2;
		}
		if (logpath != NULL && !native) calllog(logpath);
		uint64_t cpu0 = cpu_ns(), start = now_ns(), t = start, remoted = 0, local = 0, issue = 0;
		for (size_t i = 0; i < ncalls; i++) {
			const struct call *c = &calls[i];
			for (uint64_t until = t + c->gap; now_ns() < until;)
				;
			if (c->local > 0) {
				uint64_t l0 = now_ns();
				for (unsigned k = 0; k < c->local; k++) cuCtxGetDevice(&dev);
				local += now_ns() - l0;
			}
			uint64_t c0 = now_ns();
			switch (c->kind) {
			case LAUNCH:
			case LAUNCH_EX: {
				size_t size = args_size(c->bytes, c->kind == LAUNCH ? LAUNCH_FIXED : LAUNCH_EX_FIXED, native);
				memcpy(args, &c->gpu, 8);
				void *extra[] = {(void *)1, args, (void *)2, &size, (void *)0};
				if (c->kind == LAUNCH) {
					r = cuLaunchKernel(busy, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra);
				} else {
					struct launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL, &attr, 1};
					r = cuLaunchKernelEx(&cfg, busy, NULL, extra);
				}
				if (r != 0) die("launch", r);
				break;
			}
			case MEMSET:
				if ((r = cuMemsetD8Async(buf, 0, 256, NULL)) != 0) die("cuMemsetD8Async", r);
				break;
			case SYNC:
				issue = c0 - start;
				if ((r = cuCtxSynchronize()) != 0) die("cuCtxSynchronize", r);
				break;
			}
			t = now_ns();
			if (c->kind != SYNC) remoted += t - c0;
		}
		uint64_t wall = t - start, cpu = cpu_ns() - cpu0;
		if (logpath != NULL && !native) {
			calllog(NULL);
			logpath = NULL;
		}
		printf("pass %llu %llu %llu %llu %llu %llu\n", (unsigned long long)wall, (unsigned long long)issue,
		       (unsigned long long)remoted, (unsigned long long)local, (unsigned long long)cpu,
		       (unsigned long long)start);
		fflush(stdout);
	}
	return 0;
}

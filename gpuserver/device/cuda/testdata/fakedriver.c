/*
 * fakedriver.c: a stand-in for libcuda.so.1 in the cuda backend's tests on machines without a GPU. It does no work:
 * it hands out handles and addresses, and counts the calls the backend makes, in a file the test reads (the path in
 * FAKE_CUDA_COUNTERS: one 64-bit counter per entry of enum counter). A stream's work is pending from a launch until
 * a cuStreamSynchronize, so that a wait which never blocks in the driver never sees it complete.
 * Built by the test (cc -shared -fPIC).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_READY = 600 };

/* The counters, in the order the test reads them (fakedriver_test.go). */
enum counter {
	C_MODULE_GET_FUNCTION,
	C_FUNC_GET_PARAM_INFO,
	C_LAUNCH,
	C_MEM_MAP,
	C_MEM_SET_ACCESS,
	C_MEM_CREATE,
	C_STREAM_SYNCHRONIZE,
	C_STREAM_QUERY,
	C_EVENT_SYNCHRONIZE,
	C_MEM_UNMAP,
	C_COUNT
};

static volatile uint64_t *counters;
static uint64_t local_counters[C_COUNT];
static volatile int pending; /* a stream has work a synchronize must wait for */

__attribute__((constructor)) static void init(void) {
	counters = local_counters;
	const char *path = getenv("FAKE_CUDA_COUNTERS");
	if (path == NULL) return;
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, C_COUNT * 8) != 0) return;
	void *p = mmap(NULL, C_COUNT * 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED) counters = p;
}

static void count(enum counter c) { __atomic_add_fetch(&counters[c], 1, __ATOMIC_SEQ_CST); }
static uint64_t next_handle = 0x1000;
static uint64_t handle(void) { return __atomic_add_fetch(&next_handle, 0x10, __ATOMIC_SEQ_CST); }

EXPORT CUresult cuInit(unsigned flags) { return flags == 0 ? OK : INVALID_VALUE; }
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
	*s = r == OK ? "no error" : "fake driver error";
	return OK;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
	*n = 1;
	return OK;
}
EXPORT CUresult cuDeviceGet(int *d, int i) {
	*d = i;
	return i == 0 ? OK : INVALID_VALUE;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, int dev) {
	snprintf(name, (size_t)len, "Fake GPU");
	return OK;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) {
	*bytes = 80ull << 30;
	return OK;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
	switch (attr) {
	case 75: /* compute capability major */
		*v = 9;
		break;
	case 76:
		*v = 0;
		break;
	default:
		*v = 1;
	}
	return OK;
}
EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, int dev) {
	snprintf(id, (size_t)len, "0000:01:00.0");
	return OK;
}
EXPORT CUresult cuDeviceGetUuid(unsigned char *uuid, int dev) {
	memset(uuid, 0x42, 16);
	return OK;
}
EXPORT CUresult cuDeviceCanAccessPeer(int *can, int a, int b) {
	*can = 0;
	return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	*ctx = (void *)0x77;
	return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return OK; }
EXPORT CUresult cuCtxSetCurrent(void *ctx) { return OK; }
EXPORT CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int dev) {
	*ctx = (void *)handle();
	return OK;
}
EXPORT CUresult cuCtxDestroy_v2(void *ctx) { return OK; }
EXPORT CUresult cuCtxPopCurrent_v2(void **ctx) {
	*ctx = NULL;
	return OK;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	*free = *total = 80ull << 30;
	return OK;
}
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
	*g = 2u << 20;
	return OK;
}
static uint64_t next_address = 0x7f0000000000ull;
EXPORT CUresult cuMemAddressReserve(uint64_t *ptr, size_t size, size_t align, uint64_t addr, unsigned long long f) {
	if (addr != 0) {
		*ptr = addr;
		return OK;
	}
	*ptr = __atomic_fetch_add(&next_address, (size + (2u << 20)) & ~(uint64_t)((2u << 20) - 1), __ATOMIC_SEQ_CST);
	return OK;
}
EXPORT CUresult cuMemAddressFree(uint64_t ptr, size_t size) { return OK; }
EXPORT CUresult cuMemCreate(uint64_t *h, size_t size, const void *prop, unsigned long long flags) {
	count(C_MEM_CREATE);
	*h = handle();
	return OK;
}
EXPORT CUresult cuMemRelease(uint64_t h) { return OK; }
EXPORT CUresult cuMemMap(uint64_t ptr, size_t size, size_t offset, uint64_t h, unsigned long long flags) {
	count(C_MEM_MAP);
	return OK;
}
EXPORT CUresult cuMemUnmap(uint64_t ptr, size_t size) {
	count(C_MEM_UNMAP);
	return OK;
}
EXPORT CUresult cuMemSetAccess(uint64_t ptr, size_t size, const void *desc, size_t n) {
	count(C_MEM_SET_ACCESS);
	return OK;
}
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) { return OK; }
EXPORT CUresult cuMemHostUnregister(void *p) { return OK; }
EXPORT CUresult cuStreamCreate(void **s, unsigned flags) {
	*s = (void *)handle();
	return OK;
}
EXPORT CUresult cuStreamDestroy_v2(void *s) { return OK; }
EXPORT CUresult cuStreamSynchronize(void *s) {
	count(C_STREAM_SYNCHRONIZE);
	pending = 0;
	return OK;
}
EXPORT CUresult cuStreamQuery(void *s) {
	count(C_STREAM_QUERY);
	return pending ? NOT_READY : OK;
}
EXPORT CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { return OK; }
EXPORT CUresult cuEventCreate(void **e, unsigned flags) {
	*e = (void *)handle();
	return OK;
}
EXPORT CUresult cuEventRecord(void *e, void *s) { return OK; }
EXPORT CUresult cuEventQuery(void *e) { return pending ? NOT_READY : OK; }
EXPORT CUresult cuEventSynchronize(void *e) {
	count(C_EVENT_SYNCHRONIZE);
	pending = 0;
	return OK;
}
EXPORT CUresult cuEventDestroy_v2(void *e) { return OK; }
EXPORT CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
	*ms = 0;
	return OK;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s) { return OK; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s) { return OK; }
EXPORT CUresult cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *s) { return OK; }
EXPORT CUresult cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, void *s) { return OK; }
EXPORT CUresult cuMemsetD32Async(uint64_t dst, unsigned v, size_t n, void *s) { return OK; }
EXPORT CUresult cuModuleLoadData(void **m, const void *image) {
	*m = (void *)handle();
	return OK;
}
EXPORT CUresult cuModuleUnload(void *m) { return OK; }
EXPORT CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	count(C_MODULE_GET_FUNCTION);
	*f = (void *)handle();
	return OK;
}
EXPORT CUresult cuModuleGetGlobal_v2(uint64_t *p, size_t *size, void *m, const char *name) { return 500; }
/* Every kernel has one 8-byte parameter. */
EXPORT CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) {
	count(C_FUNC_GET_PARAM_INFO);
	if (i > 0) return INVALID_VALUE;
	*off = 0;
	*size = 8;
	return OK;
}
EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			       unsigned shmem, void *s, void **params, void **extra) {
	count(C_LAUNCH);
	pending = 1;
	return OK;
}

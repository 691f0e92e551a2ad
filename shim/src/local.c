/*
 * local.c: entry points the shim answers without a round trip: initialisation, versions, error strings, the one
 * device the function sees (its attributes come with the hello; its memory is the function's quota), the primary
 * context, and host memory (pinned host memory is emulated with ordinary pages).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

struct shim_stats shim_stats;

/* faasGpuShimStats copies the shim's counters (struct shim_stats, six u64) for tests and reports; it returns the
 * number of bytes written. Not a CUDA entry point: tools find it with dlsym on libcuda.so.1. */
SHIM_EXPORT size_t faasGpuShimStats(void *out, size_t size) {
	struct shim_stats s;
	s.sync_calls = __atomic_load_n(&shim_stats.sync_calls, __ATOMIC_RELAXED);
	s.async_calls = __atomic_load_n(&shim_stats.async_calls, __ATOMIC_RELAXED);
	s.local_calls = __atomic_load_n(&shim_stats.local_calls, __ATOMIC_RELAXED);
	s.unsupported = __atomic_load_n(&shim_stats.unsupported, __ATOMIC_RELAXED);
	s.unknown_slots = __atomic_load_n(&shim_stats.unknown_slots, __ATOMIC_RELAXED);
	s.syncs_answered = __atomic_load_n(&shim_stats.syncs_answered, __ATOMIC_RELAXED);
	if (out == NULL) return 0;
	if (size > sizeof s) size = sizeof s;
	memcpy(out, &s, size);
	return size;
}

SHIM_EXPORT int cuInit(unsigned int flags) {
	SHIM_LOCAL();
	if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
	return shim_connect();
}

SHIM_EXPORT int cuDriverGetVersion(int *version) {
	SHIM_LOCAL();
	if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
	*version = SHIM_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

static const struct {
	int code;
	const char *name;
	const char *text;
} errors[] = {
	{0, "CUDA_SUCCESS", "no error"},
	{1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	{46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	{100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	{218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	{400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{600, "CUDA_ERROR_NOT_READY", "device not ready"},
	{700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	{719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	{800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	{801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized (gpuserver unreachable)"},
	{803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
	{999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

SHIM_EXPORT int cuGetErrorString(int error, const char **str) {
	SHIM_LOCAL();
	if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
		if (errors[i].code == error) {
			*str = errors[i].text;
			return CUDA_SUCCESS;
		}
	*str = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

SHIM_EXPORT int cuGetErrorName(int error, const char **str) {
	SHIM_LOCAL();
	if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
		if (errors[i].code == error) {
			*str = errors[i].name;
			return CUDA_SUCCESS;
		}
	*str = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* device returns the connected device, checking the ordinal (a function sees exactly one device, 0). */
static int device(int dev, const struct shim_device **d) {
	int r = shim_connect();
	if (r != 0) return r;
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	*d = shim_device();
	return *d == NULL ? CUDA_ERROR_NOT_INITIALIZED : CUDA_SUCCESS;
}

SHIM_EXPORT int cuDeviceGetCount(int *count) {
	SHIM_LOCAL();
	if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = shim_connect();
	if (r != 0) return r;
	*count = 1;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDeviceGet(int *dev, int ordinal) {
	SHIM_LOCAL();
	if (dev == NULL) return CUDA_ERROR_INVALID_VALUE;
	const struct shim_device *d;
	int r = device(ordinal, &d);
	if (r == 0) *dev = 0;
	return r;
}

SHIM_EXPORT int cuDeviceGetName(char *name, int len, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r != 0) return r;
	snprintf(name, (size_t)len, "%s", d->name);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDeviceGetUuid(void *uuid, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r == 0) memcpy(uuid, d->uuid, 16);
	return r;
}

SHIM_EXPORT int cuDeviceGetUuid_v2(void *uuid, int dev) { return cuDeviceGetUuid(uuid, dev); }

SHIM_EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r == 0) *bytes = d->total_mem;
	return r;
}

SHIM_EXPORT int cuDeviceGetAttribute(int *pi, int attrib, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (pi == NULL || attrib <= 0 || attrib >= SHIM_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r == 0) *pi = d->attrs[attrib];
	return r;
}

/* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR */
enum { ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76 };

SHIM_EXPORT int cuDeviceComputeCapability(int *major, int *minor, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (major == NULL || minor == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r == 0) {
		*major = d->attrs[ATTR_CC_MAJOR];
		*minor = d->attrs[ATTR_CC_MINOR];
	}
	return r;
}

SHIM_EXPORT int cuDeviceGetPCIBusId(char *pciBusId, int len, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (pciBusId == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	/* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _PCI_BUS_ID, _PCI_DEVICE_ID */
	if (r == 0) snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.0", d->attrs[50], d->attrs[33], d->attrs[34]);
	return r;
}

/* The primary context: one per process; the gpuserver binds it to whichever GPU serves the current request. */
static int primary_ctx;
static int primary_retained;
static __thread void *current_ctx;
#define PRIMARY ((void *)&primary_ctx)

SHIM_EXPORT int cuDevicePrimaryCtxRetain(void **pctx, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r != 0) return r;
	__atomic_add_fetch(&primary_retained, 1, __ATOMIC_SEQ_CST);
	*pctx = PRIMARY;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDevicePrimaryCtxRelease_v2(int dev) {
	SHIM_LOCAL();
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	int left = 1;
	if (__atomic_load_n(&primary_retained, __ATOMIC_SEQ_CST) > 0)
		left = __atomic_sub_fetch(&primary_retained, 1, __ATOMIC_SEQ_CST);
	if (left == 0) shim_context_storage_destroy(PRIMARY); /* the primary context's life ends */
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDevicePrimaryCtxGetState(int dev, unsigned int *flags, int *active) {
	SHIM_LOCAL();
	if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	*flags = 0;
	*active = __atomic_load_n(&primary_retained, __ATOMIC_SEQ_CST) > 0;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDevicePrimaryCtxSetFlags_v2(int dev, unsigned int flags) {
	SHIM_LOCAL();
	(void)flags;
	return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SHIM_EXPORT int cuDevicePrimaryCtxReset_v2(int dev) {
	SHIM_LOCAL();
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	shim_context_storage_destroy(PRIMARY);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxCreate_v2(void **pctx, unsigned int flags, int dev) {
	SHIM_LOCAL();
	(void)flags;
	int r = cuDevicePrimaryCtxRetain(pctx, dev);
	if (r == 0) current_ctx = *pctx;
	return r;
}

SHIM_EXPORT int cuCtxDestroy_v2(void *ctx) {
	SHIM_LOCAL();
	if (ctx != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT;
	if (current_ctx == ctx) current_ctx = NULL;
	return cuDevicePrimaryCtxRelease_v2(0);
}

SHIM_EXPORT int cuCtxGetCurrent(void **pctx) {
	SHIM_LOCAL();
	if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
	*pctx = current_ctx;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxSetCurrent(void *ctx) {
	SHIM_LOCAL();
	if (ctx != NULL && ctx != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT;
	current_ctx = ctx;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxPushCurrent_v2(void *ctx) {
	SHIM_LOCAL();
	if (ctx != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT;
	current_ctx = ctx;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxPopCurrent_v2(void **pctx) {
	SHIM_LOCAL();
	if (pctx != NULL) *pctx = current_ctx;
	current_ctx = NULL;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxGetDevice(int *dev) {
	SHIM_LOCAL();
	if (dev == NULL) return CUDA_ERROR_INVALID_VALUE;
	*dev = 0;
	return CUDA_SUCCESS;
}

/* CUDA 13: the device of ctx (NULL: the current context). The shim has one context, on device 0. */
SHIM_EXPORT int cuCtxGetDevice_v2(int *dev, void *ctx) {
	SHIM_LOCAL();
	if (dev == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (ctx != NULL && ctx != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx == NULL && current_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
	*dev = 0;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxGetApiVersion(void *ctx, unsigned int *version) {
	SHIM_LOCAL();
	(void)ctx;
	if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
	*version = 3020;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxGetFlags(unsigned int *flags) {
	SHIM_LOCAL();
	if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
	*flags = 0;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxGetStreamPriorityRange(int *least, int *greatest) {
	SHIM_LOCAL();
	if (least != NULL) *least = 0;
	if (greatest != NULL) *greatest = -5;
	return CUDA_SUCCESS;
}

void *shim_primary_ctx(void) { return PRIMARY; }

/* shim_current_ctx is the calling thread's current context, for the shim's own use (not counted as a call). */
void *shim_current_ctx(void) { return current_ctx; }

/* CUDA 12.5+ and 13: the context parameters (execution affinity, CIG) are not supported; without them these are
 * cuCtxCreate_v2. */
SHIM_EXPORT int cuCtxCreate_v4(void **pctx, const void *params, unsigned int flags, int dev) {
	SHIM_LOCAL();
	if (params != NULL) return shim_unsupported("cuCtxCreate with CUctxCreateParams");
	return cuCtxCreate_v2(pctx, flags, dev);
}

SHIM_EXPORT int cuCtxCreate_v3(void **pctx, const void *affinity, int n, unsigned int flags, int dev) {
	SHIM_LOCAL();
	if (affinity != NULL && n > 0) return shim_unsupported("cuCtxCreate with execution affinity");
	return cuCtxCreate_v2(pctx, flags, dev);
}

SHIM_EXPORT int cuCtxSetFlags(unsigned int flags) {
	SHIM_LOCAL();
	(void)flags;
	return current_ctx != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

SHIM_EXPORT int cuCtxGetId(void *ctx, unsigned long long *id) {
	SHIM_LOCAL();
	if (id == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (ctx != NULL && ctx != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT;
	*id = 1;
	return CUDA_SUCCESS;
}

/* Context limits (CUlimit), kept per process: the driver on the gpuserver sizes a kernel's stack and heap as its
 * launches need. */
static size_t limits[10] = {1024, 1048576, 8388608, 2, 2048, 32, 0, 0, 0, 0};
static pthread_mutex_t limits_mu = PTHREAD_MUTEX_INITIALIZER;

SHIM_EXPORT int cuCtxGetLimit(size_t *value, int limit) {
	SHIM_LOCAL();
	if (value == NULL || limit < 0 || limit >= (int)(sizeof limits / sizeof limits[0]))
		return 215; /* CUDA_ERROR_UNSUPPORTED_LIMIT */
	pthread_mutex_lock(&limits_mu);
	*value = limits[limit];
	pthread_mutex_unlock(&limits_mu);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxSetLimit(int limit, size_t value) {
	SHIM_LOCAL();
	if (limit < 0 || limit >= (int)(sizeof limits / sizeof limits[0])) return 215;
	pthread_mutex_lock(&limits_mu);
	limits[limit] = value;
	pthread_mutex_unlock(&limits_mu);
	return CUDA_SUCCESS;
}

/* Cache and shared memory preferences: kept, as the driver may ignore them. */
static int cache_config, shmem_config;

SHIM_EXPORT int cuCtxGetCacheConfig(int *config) {
	SHIM_LOCAL();
	if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
	*config = __atomic_load_n(&cache_config, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxSetCacheConfig(int config) {
	SHIM_LOCAL();
	if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE;
	__atomic_store_n(&cache_config, config, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxGetSharedMemConfig(int *config) {
	SHIM_LOCAL();
	if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
	*config = __atomic_load_n(&shmem_config, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxSetSharedMemConfig(int config) {
	SHIM_LOCAL();
	if (config < 0 || config > 2) return CUDA_ERROR_INVALID_VALUE;
	__atomic_store_n(&shmem_config, config, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuCtxResetPersistingL2Cache(void) {
	SHIM_LOCAL();
	return CUDA_SUCCESS; /* nothing persists: the shim sets no access policy windows */
}

/* The function sees one device: it has no peer. */
SHIM_EXPORT int cuDeviceCanAccessPeer(int *can, int dev, int peer) {
	SHIM_LOCAL();
	if (can == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0 || peer != 0) return CUDA_ERROR_INVALID_DEVICE;
	*can = 0;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuDeviceGetP2PAttribute(int *value, int attrib, int src, int dst) {
	SHIM_LOCAL();
	(void)attrib;
	if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
	return CUDA_ERROR_INVALID_DEVICE; /* no peer, and a device is not its own peer */
}

SHIM_EXPORT int cuDeviceGetByPCIBusId(int *dev, const char *pciBusId) {
	SHIM_LOCAL();
	char mine[32];
	if (dev == NULL || pciBusId == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = cuDeviceGetPCIBusId(mine, sizeof mine, 0);
	if (r != 0) return r;
	if (strcasecmp(mine, pciBusId) != 0) return CUDA_ERROR_INVALID_DEVICE;
	*dev = 0;
	return CUDA_SUCCESS;
}

/* The widest 1D linear texture of an element size: the device's limit (CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_
 * LINEAR_WIDTH counts bytes of one-byte elements). */
SHIM_EXPORT int cuDeviceGetTexture1DLinearMaxWidth(size_t *maxWidth, int format, unsigned numChannels, int dev) {
	SHIM_LOCAL();
	const struct shim_device *d;
	(void)format, (void)numChannels;
	if (maxWidth == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = device(dev, &d);
	if (r == 0) *maxWidth = (size_t)d->attrs[69];
	return r;
}

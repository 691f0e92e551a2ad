/*
 * alloc.c: the shim's own table of the function's memory: device blocks (cuMemAlloc and friends, at the fixed
 * addresses the gpuserver hands out), page-locked host memory (cuMemHostAlloc, emulated with ordinary pages: the
 * gpuserver copies through the ring, so nothing needs pinning in this process) and registered host ranges
 * (cuMemHostRegister). Pointer attributes (cuPointerGetAttribute, cuPointerGetAttributes) are answered from it
 * without a round trip.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

enum kind { KIND_DEVICE = 1, KIND_HOST_ALLOC, KIND_HOST_REGISTERED };

struct range {
	uint64_t base, size;
	int kind;
	unsigned flags;
	uint64_t id; /* process-wide unique buffer id */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges; /* sorted by base, non-overlapping */
static size_t nranges, capranges;
static uint64_t next_id = 1;

/* find returns the index of the range containing p, or -1. Called with mu held. */
static long find(uint64_t p) {
	size_t lo = 0, hi = nranges;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (ranges[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0) return -1;
	const struct range *r = &ranges[lo - 1];
	return p - r->base < r->size || (r->size == 0 && p == r->base) ? (long)(lo - 1) : -1;
}

static int add(uint64_t base, uint64_t size, int kind, unsigned flags) {
	pthread_mutex_lock(&mu);
	if (nranges == capranges) {
		size_t cap = capranges ? capranges * 2 : 256;
		struct range *r = realloc(ranges, cap * sizeof *r);
		if (r == NULL) {
			pthread_mutex_unlock(&mu);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		ranges = r;
		capranges = cap;
	}
	size_t i = 0, hi = nranges;
	while (i < hi) {
		size_t mid = (i + hi) / 2;
		if (ranges[mid].base < base)
			i = mid + 1;
		else
			hi = mid;
	}
	memmove(&ranges[i + 1], &ranges[i], (nranges - i) * sizeof *ranges);
	ranges[i] = (struct range){.base = base, .size = size, .kind = kind, .flags = flags, .id = next_id++};
	nranges++;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* del removes the range starting exactly at base of the given kind; 0 if none. */
static int del(uint64_t base, int kind) {
	pthread_mutex_lock(&mu);
	long i = find(base);
	int ok = i >= 0 && ranges[i].base == base && ranges[i].kind == kind;
	if (ok) {
		memmove(&ranges[i], &ranges[i + 1], (nranges - (size_t)i - 1) * sizeof *ranges);
		nranges--;
	}
	pthread_mutex_unlock(&mu);
	return ok;
}

static int lookup(uint64_t p, struct range *out) {
	pthread_mutex_lock(&mu);
	long i = find(p);
	if (i >= 0) *out = ranges[i];
	pthread_mutex_unlock(&mu);
	return i >= 0;
}

/* ---- device memory */

SHIM_EXPORT int cuMemAlloc_v2(unsigned long long *dptr, size_t bytesize) {
	int r = rpc_cuMemAlloc_v2(dptr, bytesize);
	if (r == 0) r = add(*dptr, bytesize, KIND_DEVICE, 0);
	return r;
}

SHIM_EXPORT int cuMemAllocAsync(unsigned long long *dptr, size_t bytesize, void *hStream) {
	int r = rpc_cuMemAllocAsync(dptr, bytesize, hStream);
	if (r == 0) r = add(*dptr, bytesize, KIND_DEVICE, 0);
	return r;
}

SHIM_EXPORT int cuMemAllocPitch_v2(unsigned long long *dptr, size_t *pitch, size_t width, size_t height,
				   unsigned int elementSize) {
	int r = rpc_cuMemAllocPitch_v2(dptr, pitch, width, height, elementSize);
	if (r == 0) r = add(*dptr, (uint64_t)*pitch * height, KIND_DEVICE, 0);
	return r;
}

SHIM_EXPORT int cuMemFree_v2(unsigned long long dptr) {
	if (dptr == 0) return CUDA_SUCCESS;
	int r = rpc_cuMemFree_v2(dptr);
	if (r == 0) del(dptr, KIND_DEVICE);
	return r;
}

SHIM_EXPORT int cuMemFreeAsync(unsigned long long dptr, void *hStream) {
	int r = rpc_cuMemFreeAsync(dptr, hStream);
	if (r == 0) del(dptr, KIND_DEVICE);
	return r;
}

/* ---- virtual memory management: a mapping is device memory at the address the function chose */

SHIM_EXPORT int cuMemMap(unsigned long long ptr, size_t size, size_t offset, void *handle, unsigned long long flags) {
	int r = rpc_cuMemMap(ptr, size, offset, handle, flags);
	if (r == 0) r = add(ptr, size, KIND_DEVICE, 0);
	return r;
}

SHIM_EXPORT int cuMemUnmap(unsigned long long ptr, size_t size) {
	int r = rpc_cuMemUnmap(ptr, size);
	if (r != 0) return r;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nranges;) { /* the mappings inside [ptr, ptr+size) */
		if (ranges[i].kind == KIND_DEVICE && ranges[i].base >= ptr && ranges[i].base - ptr < size) {
			memmove(&ranges[i], &ranges[i + 1], (nranges - i - 1) * sizeof *ranges);
			nranges--;
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* ---- host memory */

SHIM_EXPORT int cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
	SHIM_LOCAL();
	if (pp == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = shim_connect();
	if (r != 0) return r;
	if (posix_memalign(pp, 4096, bytesize == 0 ? 1 : bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
	r = add((uintptr_t)*pp, bytesize, KIND_HOST_ALLOC, flags);
	if (r != 0) {
		free(*pp);
		*pp = NULL;
	}
	return r;
}

SHIM_EXPORT int cuMemAllocHost_v2(void **pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

SHIM_EXPORT int cuMemFreeHost(void *p) {
	SHIM_LOCAL();
	if (p == NULL) return CUDA_SUCCESS;
	if (!del((uintptr_t)p, KIND_HOST_ALLOC)) return CUDA_ERROR_INVALID_VALUE;
	free(p);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags) {
	SHIM_LOCAL();
	if (p == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
	struct range r;
	if (lookup((uintptr_t)p, &r) || lookup((uintptr_t)p + bytesize - 1, &r))
		return 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
	return add((uintptr_t)p, bytesize, KIND_HOST_REGISTERED, flags);
}

SHIM_EXPORT int cuMemHostUnregister(void *p) {
	SHIM_LOCAL();
	if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
	return del((uintptr_t)p, KIND_HOST_REGISTERED) ? CUDA_SUCCESS : 713; /* ..._NOT_REGISTERED */
}

SHIM_EXPORT int cuMemHostGetFlags(unsigned int *flags, void *p) {
	SHIM_LOCAL();
	if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
	struct range r;
	if (!lookup((uintptr_t)p, &r) || r.kind == KIND_DEVICE) return CUDA_ERROR_INVALID_VALUE;
	*flags = r.flags;
	return CUDA_SUCCESS;
}

/* ---- pointer attributes */

enum {
	PA_CONTEXT = 1,
	PA_MEMORY_TYPE,
	PA_DEVICE_POINTER,
	PA_HOST_POINTER,
	PA_P2P_TOKENS,
	PA_SYNC_MEMOPS,
	PA_BUFFER_ID,
	PA_IS_MANAGED,
	PA_DEVICE_ORDINAL,
	PA_IS_LEGACY_CUDA_IPC_CAPABLE,
	PA_RANGE_START_ADDR,
	PA_RANGE_SIZE,
	PA_MAPPED,
	PA_ALLOWED_HANDLE_TYPES,
	PA_IS_GPU_DIRECT_RDMA_CAPABLE,
	PA_ACCESS_FLAGS,
	PA_MEMPOOL_HANDLE,
	PA_MAPPING_SIZE,
	PA_MAPPING_BASE_ADDR,
	PA_MEMORY_BLOCK_ID,
	PA_IS_HW_DECOMPRESS_CAPABLE,
};
enum { MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2 };

/* attr writes attribute a of pointer p (inside range r, or in no range when r is NULL) to data. It returns
 * CUDA_ERROR_INVALID_VALUE for an attribute that does not apply, as the driver does. */
static int attr(int a, uint64_t p, const struct range *r, void *data) {
	uint64_t v = 0;
	int size = 4;
	int dev = r != NULL && r->kind == KIND_DEVICE;
	switch (a) {
	case PA_CONTEXT:
	case PA_MEMPOOL_HANDLE:
		size = 8;
		v = a == PA_CONTEXT && r != NULL ? (uintptr_t)shim_primary_ctx() : 0;
		break;
	case PA_MEMORY_TYPE:
		v = r == NULL ? 0 : dev ? MEMORYTYPE_DEVICE : MEMORYTYPE_HOST;
		break;
	case PA_DEVICE_POINTER: /* unified addressing: a host range's device address is its own */
		size = 8;
		v = r != NULL ? p : 0;
		break;
	case PA_HOST_POINTER:
		size = 8;
		if (dev) return CUDA_ERROR_INVALID_VALUE;
		v = r != NULL ? p : 0;
		break;
	case PA_P2P_TOKENS:
		return CUDA_ERROR_INVALID_VALUE;
	case PA_BUFFER_ID:
	case PA_MEMORY_BLOCK_ID:
		size = 8;
		v = r != NULL ? r->id : 0;
		break;
	case PA_RANGE_START_ADDR:
	case PA_MAPPING_BASE_ADDR:
		size = 8;
		v = r != NULL ? r->base : 0;
		break;
	case PA_RANGE_SIZE:
	case PA_MAPPING_SIZE:
		size = 8;
		v = r != NULL ? r->size : 0;
		break;
	case PA_MAPPED:
		v = r != NULL;
		break;
	case PA_ACCESS_FLAGS:
		v = r != NULL ? 3 : 0; /* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE */
		break;
	case PA_DEVICE_ORDINAL:
		v = r != NULL ? 0 : (uint64_t)-2; /* -2: no device (the driver's CU_DEVICE_INVALID) */
		break;
	case PA_SYNC_MEMOPS:
	case PA_IS_MANAGED:
	case PA_IS_LEGACY_CUDA_IPC_CAPABLE:
	case PA_ALLOWED_HANDLE_TYPES:
	case PA_IS_GPU_DIRECT_RDMA_CAPABLE:
	case PA_IS_HW_DECOMPRESS_CAPABLE:
		v = 0;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (data != NULL) memcpy(data, &v, (size_t)size);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
	SHIM_LOCAL();
	if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
	struct range r;
	if (!lookup(ptr, &r)) return CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
	return attr(attribute, ptr, &r, data);
}

/* Unlike cuPointerGetAttribute, a pointer the driver does not know is no error: its attributes are zero. */
SHIM_EXPORT int cuPointerGetAttributes(unsigned int n, int *attributes, void **data, unsigned long long ptr) {
	SHIM_LOCAL();
	if (n > 0 && (attributes == NULL || data == NULL)) return CUDA_ERROR_INVALID_VALUE;
	struct range r;
	int known = lookup(ptr, &r);
	for (unsigned i = 0; i < n; i++) {
		if (data[i] == NULL) continue;
		int e = attr(attributes[i], ptr, known ? &r : NULL, data[i]);
		if (e == CUDA_ERROR_INVALID_VALUE && attributes[i] == PA_HOST_POINTER) {
			uint64_t zero = 0;
			memcpy(data[i], &zero, 8); /* a device pointer has no host address */
		} else if (e != 0) {
			return e;
		}
	}
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuMemGetAddressRange_v2(unsigned long long *pbase, size_t *psize, unsigned long long dptr) {
	SHIM_LOCAL();
	struct range r;
	if (!lookup(dptr, &r) || r.kind != KIND_DEVICE) return CUDA_ERROR_NOT_FOUND;
	if (pbase != NULL) *pbase = r.base;
	if (psize != NULL) *psize = r.size;
	return CUDA_SUCCESS;
}

/* ---- module globals: device memory at the address the function sees (the gpuserver translates it per GPU) */

SHIM_EXPORT int cuModuleGetGlobal_v2(unsigned long long *dptr, size_t *bytes, void *hmod, const char *name) {
	unsigned long long p = 0;
	size_t n = 0;
	int r = rpc_cuModuleGetGlobal_v2(&p, &n, hmod, name);
	if (r != 0) return r;
	struct range old;
	if (!lookup(p, &old)) add(p, n, KIND_DEVICE, 0);
	if (dptr != NULL) *dptr = p;
	if (bytes != NULL) *bytes = n;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuLibraryGetGlobal(unsigned long long *dptr, size_t *bytes, void *library, const char *name) {
	return cuModuleGetGlobal_v2(dptr, bytes, library, name); /* a library is a module on the gpuserver */
}

/* shim_device_address reports whether p lies in device memory the function allocated or looked up. */
int shim_device_address(uint64_t p) {
	struct range r;
	return lookup(p, &r) && r.kind == KIND_DEVICE;
}

/* shim_host_range reports whether [p, p+n) is host memory the shim allocated or registered. */
int shim_host_range(const void *p, size_t n) {
	struct range r;
	return lookup((uintptr_t)p, &r) && r.kind != KIND_DEVICE && (uintptr_t)p - r.base + n <= r.size;
}

/* Host memory is not mapped into the GPU of a remoted function (CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY is 0):
 * page-locked host memory has no device address, as for a driver whose device cannot map it. */
SHIM_EXPORT int cuMemHostGetDevicePointer_v2(unsigned long long *pdptr, void *p, unsigned int flags) {
	SHIM_LOCAL();
	if (pdptr == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
	struct range r;
	if (lookup((uintptr_t)p, &r) && r.kind == KIND_DEVICE) { /* a device address maps to itself */
		*pdptr = (uintptr_t)p;
		return CUDA_SUCCESS;
	}
	if (shim_debug()) shim_log("cuMemHostGetDevicePointer(%p): host memory is not mapped into the GPU", p);
	return CUDA_ERROR_INVALID_VALUE;
}

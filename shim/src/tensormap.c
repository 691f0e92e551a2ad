/*
 * tensormap.c: tensor map descriptors (TMA) for Hopper kernels. cuTensorMapEncode* is a host-side computation of
 * the driver whose 128-byte result depends on the GPU and the driver version, so the gpuserver's driver computes
 * it; the shim memoises the answers by their arguments (cuBLAS encodes the same descriptors for every GEMM of a
 * shape). The descriptor carries the global address, which is the same on every GPU (fixed addresses).
 */
#include <pthread.h>
#include <string.h>

#include "shim.h"

#define REQUEST_SIZE 184 /* the packed arguments (gpuserver/remoting/funcs.go: tensorMapRequestSize) */
#define MEMO 4096

enum { TILED = 1, IM2COL = 2, IM2COL_WIDE = 3 };

struct memo {
	int valid;
	uint8_t req[REQUEST_SIZE];
	uint8_t map[128];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct memo memo[MEMO];

static uint64_t fnv(const uint8_t *p, size_t n) {
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* encode answers from the memo or asks the gpuserver. */
static int encode(void *tensorMap, const uint8_t req[REQUEST_SIZE]) {
	if (tensorMap == NULL) return CUDA_ERROR_INVALID_VALUE;
	struct memo *m = &memo[fnv(req, REQUEST_SIZE) % MEMO];
	pthread_mutex_lock(&mu);
	int hit = m->valid && memcmp(m->req, req, REQUEST_SIZE) == 0;
	if (hit) memcpy(tensorMap, m->map, 128);
	pthread_mutex_unlock(&mu);
	if (hit) {
		SHIM_LOCAL();
		return CUDA_SUCCESS;
	}
	uint8_t map[128];
	int r = rpc_tensorMapEncode(map, req, REQUEST_SIZE);
	if (r != 0) return r;
	memcpy(tensorMap, map, 128);
	pthread_mutex_lock(&mu);
	m->valid = 1;
	memcpy(m->req, req, REQUEST_SIZE);
	memcpy(m->map, map, 128);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* pack lays the arguments out as the gpuserver reads them. Arrays hold rank (strides rank-1) entries. */
static int pack(uint8_t req[REQUEST_SIZE], int kind, int dt, unsigned rank, void *addr, const uint64_t *dims,
		const uint64_t *strides, const uint32_t *box, const uint32_t *estrides, int interleave, int swizzle,
		int l2, int oob, int mode) {
	if (rank == 0 || rank > 5 || dims == NULL || estrides == NULL || (rank > 1 && strides == NULL) ||
	    (kind == TILED && box == NULL))
		return CUDA_ERROR_INVALID_VALUE;
	memset(req, 0, REQUEST_SIZE);
	put32(req + 0, (uint32_t)kind);
	put32(req + 4, (uint32_t)dt);
	put32(req + 8, rank);
	put32(req + 12, (uint32_t)interleave);
	put32(req + 16, (uint32_t)swizzle);
	put32(req + 20, (uint32_t)l2);
	put32(req + 24, (uint32_t)oob);
	put32(req + 28, (uint32_t)mode);
	put64(req + 32, (uintptr_t)addr);
	for (unsigned i = 0; i < rank; i++) {
		put64(req + 40 + 8 * i, dims[i]);
		if (i + 1 < rank) put64(req + 80 + 8 * i, strides[i]);
		if (box != NULL) put32(req + 112 + 4 * i, box[i]);
		put32(req + 132 + 4 * i, estrides[i]);
	}
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuTensorMapEncodeTiled(void *tensorMap, int dt, unsigned rank, void *addr, const uint64_t *dims,
				       const uint64_t *strides, const uint32_t *box, const uint32_t *estrides,
				       int interleave, int swizzle, int l2, int oob) {
	uint8_t req[REQUEST_SIZE];
	int r = pack(req, TILED, dt, rank, addr, dims, strides, box, estrides, interleave, swizzle, l2, oob, 0);
	return r != 0 ? r : encode(tensorMap, req);
}

SHIM_EXPORT int cuTensorMapEncodeIm2col(void *tensorMap, int dt, unsigned rank, void *addr, const uint64_t *dims,
					const uint64_t *strides, const int *lower, const int *upper, unsigned channels,
					unsigned pixels, const uint32_t *estrides, int interleave, int swizzle, int l2,
					int oob) {
	uint8_t req[REQUEST_SIZE];
	if (lower == NULL || upper == NULL || rank < 3) return CUDA_ERROR_INVALID_VALUE;
	int r = pack(req, IM2COL, dt, rank, addr, dims, strides, NULL, estrides, interleave, swizzle, l2, oob, 0);
	if (r != 0) return r;
	for (unsigned i = 0; i < rank - 2; i++) {
		put32(req + 152 + 4 * i, (uint32_t)lower[i]);
		put32(req + 164 + 4 * i, (uint32_t)upper[i]);
	}
	put32(req + 176, channels);
	put32(req + 180, pixels);
	return encode(tensorMap, req);
}

SHIM_EXPORT int cuTensorMapEncodeIm2colWide(void *tensorMap, int dt, unsigned rank, void *addr, const uint64_t *dims,
					    const uint64_t *strides, int lower, int upper, unsigned channels,
					    unsigned pixels, const uint32_t *estrides, int interleave, int mode,
					    int swizzle, int l2, int oob) {
	uint8_t req[REQUEST_SIZE];
	int r = pack(req, IM2COL_WIDE, dt, rank, addr, dims, strides, NULL, estrides, interleave, swizzle, l2, oob,
		     mode);
	if (r != 0) return r;
	put32(req + 152, (uint32_t)lower);
	put32(req + 164, (uint32_t)upper);
	put32(req + 176, channels);
	put32(req + 180, pixels);
	return encode(tensorMap, req);
}

SHIM_EXPORT int cuTensorMapReplaceAddress(void *tensorMap, void *addr) {
	if (tensorMap == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint8_t map[128];
	int r = rpc_tensorMapReplaceAddress(map, tensorMap, (uintptr_t)addr);
	if (r == 0) memcpy(tensorMap, map, 128);
	return r;
}

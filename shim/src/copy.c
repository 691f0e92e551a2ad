/*
 * copy.c: copies between host and device. Host data travels inside the ring: a copy larger than one record is
 * split into chunks (fire-and-forget memcpyHtoDChunk records) followed by the call itself, so the server sees the
 * chunks in order and the call's own semantics (sync or async) apply to the whole copy. Device-to-host copies come
 * back through the response area, one round trip per chunk.
 */
#include <string.h>

#include "shim.h"

static uint64_t chunk_size(void) {
	uint64_t m = shim_max_payload();
	return m > 64 ? m - 64 : m;
}

static int htod(unsigned long long dst, const void *src, size_t n, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
	if (src == NULL && n != 0) return CUDA_ERROR_INVALID_VALUE;
	const uint8_t *p = src;
	uint64_t chunk = chunk_size();
	while (n > chunk) {
		if ((r = rpc_memcpyHtoDChunk(dst, p, chunk, stream)) != 0) return r;
		dst += chunk;
		p += chunk;
		n -= chunk;
	}
	return async ? rpc_cuMemcpyHtoDAsync_v2(dst, p, n, stream) : rpc_cuMemcpyHtoD_v2(dst, p, n);
}

static int dtoh(void *dst, unsigned long long src, size_t n, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
	if (dst == NULL && n != 0) return CUDA_ERROR_INVALID_VALUE;
	uint8_t *p = dst;
	uint64_t chunk = shim_max_response();
	do {
		size_t c = n > chunk ? chunk : n;
		r = async ? rpc_cuMemcpyDtoHAsync_v2(p, src, c, stream) : rpc_cuMemcpyDtoH_v2(p, src, c);
		if (r != 0) return r;
		p += c;
		src += c;
		n -= c;
	} while (n > 0);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuMemcpyHtoD_v2(unsigned long long dstDevice, const void *srcHost, size_t ByteCount) {
	return htod(dstDevice, srcHost, ByteCount, NULL, 0);
}

SHIM_EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long dstDevice, const void *srcHost, size_t ByteCount,
				     void *hStream) {
	return htod(dstDevice, srcHost, ByteCount, hStream, 1);
}

SHIM_EXPORT int cuMemcpyDtoH_v2(void *dstHost, unsigned long long srcDevice, size_t ByteCount) {
	return dtoh(dstHost, srcDevice, ByteCount, NULL, 0);
}

/* Device-to-host copies wait for their data even when async: the data must reach this process's memory. */
SHIM_EXPORT int cuMemcpyDtoHAsync_v2(void *dstHost, unsigned long long srcDevice, size_t ByteCount, void *hStream) {
	return dtoh(dstHost, srcDevice, ByteCount, hStream, 1);
}

/* is_device says whether an address lies in the gpuserver's device address window (unified addressing). */
static int is_device(unsigned long long p) {
	const struct shim_device *d = shim_device();
	return d != NULL && p >= d->va_base && p - d->va_base < d->va_size;
}

static int unified(unsigned long long dst, unsigned long long src, size_t n, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
	const struct shim_device *d = shim_device();
	if (d == NULL || d->va_size == 0) {
		/* Without the gpuserver's address window the direction is unknown: refuse rather than guess. */
		static int logged;
		if (!logged) {
			logged = 1;
			shim_log("cuMemcpy/cuMemcpyAsync: the gpuserver reported no device address window; use the "
			         "directional copies (cuMemcpyHtoD, ...): CUDA_ERROR_NOT_SUPPORTED");
		}
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	int dd = is_device(dst), sd = is_device(src);
	if (dd && sd)
		return async ? cuMemcpyDtoDAsync_v2(dst, src, n, stream) : cuMemcpyDtoD_v2(dst, src, n);
	if (dd) return htod(dst, (const void *)(uintptr_t)src, n, stream, async);
	if (sd) return dtoh((void *)(uintptr_t)dst, src, n, stream, async);
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuMemcpy(unsigned long long dst, unsigned long long src, size_t ByteCount) {
	return unified(dst, src, ByteCount, NULL, 0);
}

SHIM_EXPORT int cuMemcpyAsync(unsigned long long dst, unsigned long long src, size_t ByteCount, void *hStream) {
	return unified(dst, src, ByteCount, hStream, 1);
}

/*
 * copy.c: copies between host and device. Host data travels inside the ring: a copy larger than one record is
 * split into chunks (fire-and-forget memcpyHtoDChunk records) followed by the call itself, so the server sees the
 * chunks in order and the call's own semantics (sync or async) apply to the whole copy. Device-to-host copies come
 * back through the response area, one round trip per chunk.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int cuStreamSynchronize(void *);

uint64_t shim_chunk_size(void) {
	uint64_t m = shim_max_payload();
	return m > 64 ? m - 64 : m;
}

static int htod(unsigned long long dst, const void *src, size_t n, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
	if (src == NULL && n != 0) return CUDA_ERROR_INVALID_VALUE;
	const uint8_t *p = src;
	uint64_t chunk = shim_chunk_size();
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

/* is_device says whether an address is device memory (unified addressing): one the function allocated or looked
 * up (the shim's own table), or one in the gpuserver's device address window when it reports one. */
static int is_device(unsigned long long p) {
	const struct shim_device *d = shim_device();
	/* The window first: it takes no lock. */
	return (d != NULL && d->va_size > 0 && p >= d->va_base && p - d->va_base < d->va_size) || shim_device_address(p);
}

static int unified(unsigned long long dst, unsigned long long src, size_t n, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
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

/* --- pitched copies (cuMemcpy2D, cuMemcpy3D) and memsets (cuMemsetD2D*). Host rows travel packed, as many per
 * record as fit; device-to-device rows are one record. CUDA arrays are not supported. */

enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2, MEMTYPE_ARRAY = 3, MEMTYPE_UNIFIED = 4 };

/* CUDA_MEMCPY2D and CUDA_MEMCPY3D as cuda.h lays them out on 64-bit platforms. */
struct memcpy2d {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	unsigned long long srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	unsigned long long dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
};

struct memcpy3d {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	int srcMemoryType;
	const void *srcHost;
	unsigned long long srcDevice;
	void *srcArray;
	void *reserved0;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	int dstMemoryType;
	void *dstHost;
	unsigned long long dstDevice;
	void *dstArray;
	void *reserved1;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
};

/* One side of a pitched copy: where its first row starts and how far apart rows are. */
struct side {
	int device;
	uint64_t p;
	size_t pitch;
};

static int side_of(struct side *s, int type, const void *host, unsigned long long dev, const void *array, size_t x,
		   size_t y, size_t pitch) {
	switch (type) {
	case MEMTYPE_HOST:
		s->device = 0;
		s->p = (uintptr_t)host;
		break;
	case MEMTYPE_DEVICE:
		s->device = 1;
		s->p = dev;
		break;
	case MEMTYPE_UNIFIED: /* a unified address: device memory when it lies in the gpuserver's window */
		s->p = dev;
		s->device = is_device(dev);
		break;
	case MEMTYPE_ARRAY:
		(void)array;
		return shim_unsupported("cuMemcpy2D/3D with CUDA arrays");
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	s->pitch = pitch;
	s->p += x + (uint64_t)y * pitch;
	return CUDA_SUCCESS;
}

/* copy2d copies height rows of width bytes. */
static int copy2d(struct side dst, struct side src, size_t width, size_t height, void *stream, int async) {
	int r = shim_connect();
	if (r != 0) return r;
	if (width == 0 || height == 0) return CUDA_SUCCESS;
	if ((height > 1 && (dst.pitch < width || src.pitch < width)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!dst.device && !src.device) {
		for (size_t i = 0; i < height; i++)
			memmove((void *)(uintptr_t)(dst.p + i * dst.pitch), (const void *)(uintptr_t)(src.p + i * src.pitch),
				width);
		return CUDA_SUCCESS;
	}
	if (dst.device && src.device) {
		r = rpc_memcpy2DDtoD(dst.p, dst.pitch, src.p, src.pitch, width, height, stream);
	} else if (dst.device) { /* host rows, packed */
		uint64_t chunk = shim_chunk_size();
		if (width > chunk) { /* rows larger than a record go one by one */
			for (size_t i = 0; i < height && r == 0; i++)
				r = htod(dst.p + i * dst.pitch, (const void *)(uintptr_t)(src.p + i * src.pitch), width,
					 stream, 1);
		} else {
			size_t rows = chunk / width;
			uint8_t *buf = malloc(rows * width);
			if (buf == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
			for (size_t i = 0; i < height && r == 0; i += rows) {
				size_t n = height - i < rows ? height - i : rows;
				for (size_t j = 0; j < n; j++)
					memcpy(buf + j * width, (const void *)(uintptr_t)(src.p + (i + j) * src.pitch), width);
				r = rpc_memcpy2DHtoD(dst.p + i * dst.pitch, dst.pitch, width, n, buf, n * width, stream);
			}
			free(buf);
		}
	} else { /* device rows to host: the data comes back with each response */
		uint64_t chunk = shim_max_response();
		if (width > chunk) {
			for (size_t i = 0; i < height && r == 0; i++)
				r = dtoh((void *)(uintptr_t)(dst.p + i * dst.pitch), src.p + i * src.pitch, width, stream, 1);
			return r;
		}
		size_t rows = chunk / width;
		uint8_t *buf = malloc(rows * width);
		if (buf == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
		for (size_t i = 0; i < height && r == 0; i += rows) {
			size_t n = height - i < rows ? height - i : rows;
			r = rpc_memcpy2DDtoH(buf, src.p + i * src.pitch, src.pitch, width, n, n * width, stream);
			for (size_t j = 0; r == 0 && j < n; j++)
				memcpy((void *)(uintptr_t)(dst.p + (i + j) * dst.pitch), buf + j * width, width);
		}
		free(buf);
		return r;
	}
	if (r == 0 && !async) r = cuStreamSynchronize(stream);
	return r;
}

static int memcpy2d(const struct memcpy2d *c, void *stream, int async) {
	if (c == NULL) return CUDA_ERROR_INVALID_VALUE;
	struct side src = {0}, dst = {0};
	int r;
	if ((r = side_of(&src, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcXInBytes, c->srcY,
			 c->srcPitch)) != 0 ||
	    (r = side_of(&dst, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes, c->dstY,
			 c->dstPitch)) != 0)
		return r;
	return copy2d(dst, src, c->WidthInBytes, c->Height, stream, async);
}

SHIM_EXPORT int cuMemcpy2D_v2(const struct memcpy2d *c) { return memcpy2d(c, NULL, 0); }
SHIM_EXPORT int cuMemcpy2DUnaligned_v2(const struct memcpy2d *c) { return memcpy2d(c, NULL, 0); }
SHIM_EXPORT int cuMemcpy2DAsync_v2(const struct memcpy2d *c, void *stream) { return memcpy2d(c, stream, 1); }

/* A 3D copy is a 2D copy per slice; a slice is pitch*height bytes. */
static int memcpy3d(const struct memcpy3d *c, void *stream, int async) {
	if (c == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (c->srcLOD != 0 || c->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;
	struct side src = {0}, dst = {0};
	int r;
	if ((r = side_of(&src, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcXInBytes, c->srcY,
			 c->srcPitch)) != 0 ||
	    (r = side_of(&dst, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes, c->dstY,
			 c->dstPitch)) != 0)
		return r;
	uint64_t src_slice = (uint64_t)c->srcPitch * c->srcHeight, dst_slice = (uint64_t)c->dstPitch * c->dstHeight;
	src.p += c->srcZ * src_slice;
	dst.p += c->dstZ * dst_slice;
	size_t depth = c->Depth ? c->Depth : 1;
	for (size_t z = 0; z < depth && r == 0; z++) {
		struct side s = src, d = dst;
		s.p += z * src_slice;
		d.p += z * dst_slice;
		r = copy2d(d, s, c->WidthInBytes, c->Height, stream, 1);
	}
	if (r == 0 && !async) r = cuStreamSynchronize(stream);
	return r;
}

SHIM_EXPORT int cuMemcpy3D_v2(const struct memcpy3d *c) { return memcpy3d(c, NULL, 0); }
SHIM_EXPORT int cuMemcpy3DAsync_v2(const struct memcpy3d *c, void *stream) { return memcpy3d(c, stream, 1); }

/* The function sees one device: a peer copy is a copy within it. */
SHIM_EXPORT int cuMemcpyPeer(unsigned long long dst, void *dstCtx, unsigned long long src, void *srcCtx, size_t n) {
	(void)dstCtx, (void)srcCtx;
	return cuMemcpyDtoD_v2(dst, src, n);
}

SHIM_EXPORT int cuMemcpyPeerAsync(unsigned long long dst, void *dstCtx, unsigned long long src, void *srcCtx,
				  size_t n, void *stream) {
	(void)dstCtx, (void)srcCtx;
	return cuMemcpyDtoDAsync_v2(dst, src, n, stream);
}

static int memset2d(unsigned long long dst, size_t pitch, unsigned v, unsigned elem, size_t width, size_t height,
		    void *stream) {
	if (height > 1 && pitch < width * elem) return CUDA_ERROR_INVALID_VALUE;
	if (width == 0 || height == 0) return shim_connect();
	return rpc_memset2D(dst, pitch, v, elem, width, height, stream);
}

SHIM_EXPORT int cuMemsetD2D8_v2(unsigned long long dst, size_t pitch, unsigned char v, size_t w, size_t h) {
	return memset2d(dst, pitch, v, 1, w, h, NULL);
}
SHIM_EXPORT int cuMemsetD2D16_v2(unsigned long long dst, size_t pitch, unsigned short v, size_t w, size_t h) {
	return memset2d(dst, pitch, v, 2, w, h, NULL);
}
SHIM_EXPORT int cuMemsetD2D32_v2(unsigned long long dst, size_t pitch, unsigned v, size_t w, size_t h) {
	return memset2d(dst, pitch, v, 4, w, h, NULL);
}
SHIM_EXPORT int cuMemsetD2D8Async(unsigned long long dst, size_t pitch, unsigned char v, size_t w, size_t h,
				  void *stream) {
	return memset2d(dst, pitch, v, 1, w, h, stream);
}
SHIM_EXPORT int cuMemsetD2D16Async(unsigned long long dst, size_t pitch, unsigned short v, size_t w, size_t h,
				   void *stream) {
	return memset2d(dst, pitch, v, 2, w, h, stream);
}
SHIM_EXPORT int cuMemsetD2D32Async(unsigned long long dst, size_t pitch, unsigned v, size_t w, size_t h,
				   void *stream) {
	return memset2d(dst, pitch, v, 4, w, h, stream);
}

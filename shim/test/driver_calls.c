/*
 * driver_calls.c: the driver calls of protocol 1.1 through the shim against a real remoting server on a simulated
 * H100 node (run by gpuserver/remoting/driver_calls_test.go, which builds the server; this program is built by
 * make -C shim). Every check prints "FAIL ..." and the program ends with "ok" when all passed.
 * Usage: driver_calls KERNELS.ptx
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long dptr;
int cuInit(unsigned);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(dptr *, size_t);
int cuMemFree_v2(dptr);
int cuMemcpyHtoD_v2(dptr, const void *, size_t);
int cuMemcpyDtoH_v2(void *, dptr, size_t);
int cuMemsetD16_v2(dptr, unsigned short, size_t);
int cuMemsetD2D32_v2(dptr, size_t, unsigned, size_t, size_t);
int cuMemcpy2D_v2(const void *);
int cuMemcpy3D_v2(const void *);
int cuStreamCreate(void **, unsigned);
int cuStreamSynchronize(void *);
int cuStreamWriteValue32_v2(void *, dptr, uint32_t, unsigned);
int cuStreamWaitValue32_v2(void *, dptr, uint32_t, unsigned);
int cuStreamBatchMemOp_v2(void *, unsigned, void *, unsigned);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuModuleGetFunctionCount(unsigned *, void *);
int cuModuleEnumerateFunctions(void **, unsigned, void *);
int cuFuncGetName(const char **, void *);
int cuFuncGetModule(void **, void *);
int cuFuncGetAttribute(int *, int, void *);
int cuFuncSetAttribute(void *, int, int);
int cuFuncGetParamInfo(void *, size_t, size_t *, size_t *);
int cuLaunchKernelEx(const void *, void *, void **, void **);
int cuEventCreate(void **, unsigned);
int cuEventSynchronize(void *);
int cuEventQuery(void *);
int cuEventElapsedTime(float *, void *, void *);
int cuEventRecord(void *, void *);
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, void *, int, size_t);
int cuOccupancyMaxPotentialBlockSize(int *, int *, void *, size_t (*)(int), size_t, int);
int cuTensorMapEncodeTiled(void *, int, unsigned, void *, const uint64_t *, const uint64_t *, const uint32_t *,
			   const uint32_t *, int, int, int, int);
int cuTensorMapReplaceAddress(void *, void *);
int cuPointerGetAttribute(void *, int, dptr);
int cuPointerGetAttributes(unsigned, int *, void **, dptr);
int cuMemHostAlloc(void **, size_t, unsigned);
int cuMemFreeHost(void *);
int cuStreamIsCapturing(void *, int *);
size_t faasGpuShimStats(void *, size_t);
int cuMemGetAllocationGranularity(size_t *, const void *, int);
int cuMemAddressReserve(dptr *, size_t, size_t, dptr, unsigned long long);
int cuMemAddressFree(dptr, size_t);
int cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);
int cuMemRelease(unsigned long long);
int cuMemMap(dptr, size_t, size_t, unsigned long long, unsigned long long);
int cuMemUnmap(dptr, size_t);
int cuMemSetAccess(dptr, size_t, const void *, size_t);

static int failures;
#define CHECK(cond, ...)                                                                                           \
	do {                                                                                                        \
		if (!(cond)) {                                                                                      \
			failures++;                                                                                 \
			printf("FAIL line %d: %s: ", __LINE__, #cond);                                              \
			printf(__VA_ARGS__);                                                                        \
			printf("\n");                                                                               \
		}                                                                                                   \
	} while (0)

static uint64_t sync_calls(void) {
	uint64_t st[5];
	faasGpuShimStats(st, sizeof st);
	return st[0];
}

/* CUDA_MEMCPY2D and CUDA_MEMCPY3D as cuda.h lays them out. */
struct memcpy2d {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	dptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	dptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
};
struct memcpy3d {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	int srcMemoryType;
	const void *srcHost;
	dptr srcDevice;
	void *srcArray, *reserved0;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	int dstMemoryType;
	void *dstHost;
	dptr dstDevice;
	void *dstArray, *reserved1;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
};
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

static size_t smem_of(int block) { return (size_t)block * 16; }

int main(int argc, char **argv) {
	if (argc != 2) return 2;
	FILE *f = fopen(argv[1], "r");
	if (f == NULL) return 2;
	static char ptx[1 << 20];
	ptx[fread(ptx, 1, sizeof ptx - 1, f)] = 0;
	fclose(f);
	CHECK(cuInit(0) == 0, "cuInit");

	/* --- 2D and 3D copies with pitches, through a device buffer and back */
	enum { W = 100, H = 37, PITCH = 128 };
	uint8_t host[H][W], back[H][W];
	for (int y = 0; y < H; y++)
		for (int x = 0; x < W; x++) host[y][x] = (uint8_t)(y * 7 + x);
	dptr d, d2;
	CHECK(cuMemAlloc_v2(&d, PITCH * H) == 0 && cuMemAlloc_v2(&d2, PITCH * H) == 0, "alloc");
	struct memcpy2d c = {0};
	c.srcMemoryType = 1; /* host */
	c.srcHost = host;
	c.srcPitch = W;
	c.dstMemoryType = 2; /* device */
	c.dstDevice = d;
	c.dstPitch = PITCH;
	c.WidthInBytes = W;
	c.Height = H;
	CHECK(cuMemcpy2D_v2(&c) == 0, "2D host to device");
	struct memcpy2d dd = {0};
	dd.srcMemoryType = 2;
	dd.srcDevice = d;
	dd.srcPitch = PITCH;
	dd.dstMemoryType = 4; /* unified: the shim sees it is device memory */
	dd.dstDevice = d2;
	dd.dstPitch = PITCH;
	dd.WidthInBytes = W;
	dd.Height = H;
	CHECK(cuMemcpy2D_v2(&dd) == 0, "2D device to device");
	struct memcpy3d c3 = {0};
	c3.srcMemoryType = 2;
	c3.srcDevice = d2;
	c3.srcPitch = PITCH;
	c3.srcHeight = H;
	c3.dstMemoryType = 1;
	c3.dstHost = back;
	c3.dstPitch = W;
	c3.dstHeight = H;
	c3.WidthInBytes = W;
	c3.Height = H;
	c3.Depth = 1;
	memset(back, 0, sizeof back);
	CHECK(cuMemcpy3D_v2(&c3) == 0, "3D device to host");
	CHECK(memcmp(host, back, sizeof host) == 0, "pitched copies came back different");
	uint8_t row[PITCH];
	CHECK(cuMemcpyDtoH_v2(row, d2 + PITCH, PITCH) == 0 && memcmp(row, host[1], W) == 0, "row 1 at its pitch");

	/* --- 16-bit memsets (aligned and not) and a 2D memset */
	uint16_t h16[9];
	CHECK(cuMemsetD16_v2(d, 0xbeef, 9) == 0 && cuMemsetD16_v2(d + 2, 0x1234, 3) == 0, "memsetD16");
	CHECK(cuMemcpyDtoH_v2(h16, d, sizeof h16) == 0, "read back");
	CHECK(h16[0] == 0xbeef && h16[1] == 0x1234 && h16[3] == 0x1234 && h16[4] == 0xbeef && h16[8] == 0xbeef,
	      "memsetD16: %04x %04x %04x %04x %04x", h16[0], h16[1], h16[3], h16[4], h16[8]);
	CHECK(cuMemsetD2D32_v2(d, PITCH, 0x01020304u, 2, 3) == 0, "memsetD2D32");
	uint32_t h32[PITCH / 4 * 3];
	CHECK(cuMemcpyDtoH_v2(h32, d, sizeof h32) == 0, "read back");
	CHECK(h32[0] == 0x01020304u && h32[1] == 0x01020304u && h32[2] != 0x01020304u &&
		  h32[PITCH / 4] == 0x01020304u && h32[2 * PITCH / 4 + 1] == 0x01020304u,
	      "memsetD2D32: %08x %08x %08x %08x", h32[0], h32[1], h32[2], h32[PITCH / 4]);

	/* --- stream memory operations */
	void *s;
	CHECK(cuStreamCreate(&s, 0) == 0, "stream");
	int capturing = -1;
	CHECK(cuStreamIsCapturing(s, &capturing) == 0 && capturing == 0, "not capturing");
	CHECK(cuStreamWriteValue32_v2(s, d, 41, 0) == 0, "write value");
	CHECK(cuStreamWaitValue32_v2(s, d, 41, 1 /* EQ */) == 0, "wait for a value that holds");
	CHECK(cuStreamWaitValue32_v2(s, d, 40, 0 /* GEQ */) == 0, "wait >= that holds");
	CHECK(cuStreamWaitValue32_v2(s, d, 42, 1) == 401, "wait for a value nothing will write: ILLEGAL_STATE");
	uint8_t ops[2][48];
	memset(ops, 0, sizeof ops);
	uint32_t op = 2; /* WRITE_VALUE_32 */
	uint64_t addr = d + 4;
	uint32_t v = 7;
	memcpy(ops[0], &op, 4), memcpy(ops[0] + 8, &addr, 8), memcpy(ops[0] + 16, &v, 4);
	op = 1; /* WAIT_VALUE_32, EQ */
	uint32_t eq = 1;
	memcpy(ops[1], &op, 4), memcpy(ops[1] + 8, &addr, 8), memcpy(ops[1] + 16, &v, 4), memcpy(ops[1] + 24, &eq, 4);
	CHECK(cuStreamBatchMemOp_v2(s, 2, ops, 0) == 0, "batch of a write and a wait");
	CHECK(cuStreamWriteValue32_v2(s, 0x10, 1, 0) == 0 && cuStreamSynchronize(s) == 1,
	      "a write outside the function's memory is refused at the next synchronisation");

	/* --- kernels: names, modules, enumeration, parameter info, attributes and their sets */
	void *mod, *fn, *fn2;
	CHECK(cuModuleLoadData(&mod, ptx) == 0, "module");
	CHECK(cuModuleGetFunction(&fn, mod, "vector_add") == 0 && cuModuleGetFunction(&fn2, mod, "vector_add") == 0 &&
		  fn == fn2,
	      "a kernel has one handle");
	const char *name = NULL;
	void *m2 = NULL;
	CHECK(cuFuncGetName(&name, fn) == 0 && name != NULL && strcmp(name, "vector_add") == 0, "name %s", name);
	CHECK(cuFuncGetModule(&m2, fn) == 0 && m2 == mod, "module of the function");
	unsigned count = 0;
	CHECK(cuModuleGetFunctionCount(&count, mod) == 0 && count == 7, "%u functions", count);
	void *all[7];
	CHECK(cuModuleEnumerateFunctions(all, 7, mod) == 0, "enumerate");
	int found = 0;
	for (int i = 0; i < 7; i++) {
		const char *n = NULL;
		CHECK(cuFuncGetName(&n, all[i]) == 0 && n != NULL, "name of function %d", i);
		if (n != NULL && strcmp(n, "scale") == 0) found++;
		if (all[i] == fn) found++;
	}
	CHECK(found == 2, "enumeration finds scale and the same vector_add handle");
	size_t off = 0, size = 0;
	CHECK(cuFuncGetParamInfo(fn, 3, &off, &size) == 0 && off == 24 && size == 4, "param 3: %zu %zu", off, size);
	int a = -1;
	CHECK(cuFuncGetAttribute(&a, 0, fn) == 0 && a == 1024, "max threads per block %d", a);
	CHECK(cuFuncGetAttribute(&a, 8, fn) == 0 && a == 49152, "max dynamic shared %d", a);
	uint64_t before = sync_calls();
	CHECK(cuFuncGetAttribute(&a, 8, fn) == 0 && sync_calls() == before, "a second read costs no round trip");
	CHECK(cuFuncSetAttribute(fn, 8, 100000) == 0 && cuFuncGetAttribute(&a, 8, fn) == 0 && a == 100000,
	      "after a set: %d", a);
	CHECK(cuCtxSynchronize() == 0, "the set was accepted");
	CHECK(cuFuncSetAttribute(fn, 8, 300000) == 1 && cuFuncGetAttribute(&a, 8, fn) == 0 && a == 100000,
	      "a set above the opt-in limit is refused at once and changes nothing");
	CHECK(cuFuncSetAttribute(fn, 4, 32) == 1, "the registers cannot be set");

	/* --- occupancy, computed in the shim */
	int blocks = 0, grid = 0, block = 0;
	CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 256, 0) == 0 && blocks == 8,
	      "256 threads: %d blocks per SM", blocks);
	CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 128, 100 * 1024) == 0 && blocks == 2,
	      "100 KiB of shared memory: %d blocks per SM", blocks);
	CHECK(cuOccupancyMaxPotentialBlockSize(&grid, &block, fn, smem_of, 0, 0) == 0 && block > 0 && grid % 132 == 0,
	      "potential block size %d, grid %d", block, grid);

	/* --- cuLaunchKernelEx with a cluster and a completion event */
	enum { N = 4096 };
	float fa[N], fb[N], fc[N];
	for (int i = 0; i < N; i++) fa[i] = (float)i, fb[i] = 0.5f * (float)i;
	dptr pa, pb, pc;
	CHECK(cuMemAlloc_v2(&pa, sizeof fa) == 0 && cuMemAlloc_v2(&pb, sizeof fb) == 0 &&
		  cuMemAlloc_v2(&pc, sizeof fc) == 0,
	      "alloc");
	CHECK(cuMemcpyHtoD_v2(pa, fa, sizeof fa) == 0 && cuMemcpyHtoD_v2(pb, fb, sizeof fb) == 0, "upload");
	void *done, *start;
	CHECK(cuEventCreate(&done, 0) == 0 && cuEventCreate(&start, 0) == 0, "events");
	unsigned n = N;
	void *params[] = {&pa, &pb, &pc, &n};
	struct launch_attr attrs[2];
	memset(attrs, 0, sizeof attrs);
	attrs[0].id = 4; /* CLUSTER_DIMENSION 2x1x1 */
	uint32_t dims[3] = {2, 1, 1};
	memcpy(attrs[0].value, dims, sizeof dims);
	attrs[1].id = 12; /* LAUNCH_COMPLETION_EVENT */
	memcpy(attrs[1].value, &done, sizeof done);
	struct launch_config cfg = {{N / 256, 1, 1}, {256, 1, 1}, 0, s, attrs, 2};
	CHECK(cuEventRecord(start, s) == 0, "record");
	CHECK(cuLaunchKernelEx(&cfg, fn, params, NULL) == 0, "launch with attributes");
	CHECK(cuEventSynchronize(done) == 0 && cuEventQuery(done) == 0, "the completion event completes");
	float ms = -1;
	CHECK(cuEventElapsedTime(&ms, start, done) == 0 && ms >= 0, "elapsed %g", ms);
	CHECK(cuMemcpyDtoH_v2(fc, pc, sizeof fc) == 0, "download");
	int bad = 0;
	for (int i = 0; i < N; i++) bad += fc[i] != fa[i] + fb[i];
	CHECK(bad == 0, "%d wrong sums", bad);
	dims[0] = 3; /* does not divide the grid of 16 blocks */
	memcpy(attrs[0].value, dims, sizeof dims);
	cfg.num_attrs = 1;
	CHECK(cuLaunchKernelEx(&cfg, fn, params, NULL) == 0 && cuStreamSynchronize(s) == 1,
	      "a cluster that does not divide the grid is refused");

	/* --- tensor maps: encoded by the gpuserver, memoised, checked */
	uint8_t map[128] __attribute__((aligned(64))), map2[128] __attribute__((aligned(64)));
	uint64_t gdim[2] = {64, 64}, gstride[1] = {256};
	uint32_t box[2] = {32, 32}, estride[2] = {1, 1};
	CHECK(cuTensorMapEncodeTiled(map, 7 /* FLOAT32 */, 2, (void *)(uintptr_t)pa, gdim, gstride, box, estride, 0, 0,
				     0, 0) == 0,
	      "encode");
	before = sync_calls();
	CHECK(cuTensorMapEncodeTiled(map2, 7, 2, (void *)(uintptr_t)pa, gdim, gstride, box, estride, 0, 0, 0, 0) == 0 &&
		  memcmp(map, map2, 128) == 0 && sync_calls() == before,
	      "the same arguments are answered from the memo");
	CHECK(cuTensorMapEncodeTiled(map2, 7, 2, (void *)(uintptr_t)(pa + 4), gdim, gstride, box, estride, 0, 0, 0,
				     0) == 1,
	      "an unaligned address is refused");
	uint64_t big[2] = {64, 1 << 20};
	CHECK(cuTensorMapEncodeTiled(map2, 7, 2, (void *)(uintptr_t)pa, big, gstride, box, estride, 0, 0, 0, 0) == 1,
	      "a tensor beyond the function's memory is refused");
	CHECK(cuTensorMapReplaceAddress(map, (void *)(uintptr_t)pb) == 0 && memcmp(map, map2, 128) != 0,
	      "replace the address");

	/* --- pointer attributes from the shim's table */
	unsigned mt = 0;
	dptr start_addr = 0;
	size_t range = 0;
	CHECK(cuPointerGetAttribute(&mt, 2, pb + 8) == 0 && mt == 2, "device memory type %u", mt);
	CHECK(cuPointerGetAttribute(&start_addr, 11, pb + 8) == 0 && start_addr == pb, "range start");
	CHECK(cuPointerGetAttribute(&range, 12, pb + 8) == 0 && range == sizeof fb, "range size %zu", range);
	void *pinned;
	CHECK(cuMemHostAlloc(&pinned, 4096, 0) == 0, "pinned");
	CHECK(cuPointerGetAttribute(&mt, 2, (uintptr_t)pinned + 100) == 0 && mt == 1, "host memory type %u", mt);
	int which[2] = {2, 9};
	unsigned type = 9;
	int ordinal = 9;
	void *data[2] = {&type, &ordinal};
	CHECK(cuPointerGetAttributes(2, which, data, (uintptr_t)&type) == 0 && type == 0 && ordinal == -2,
	      "unknown memory: type %u ordinal %d", type, ordinal);
	CHECK(cuPointerGetAttribute(&mt, 2, (uintptr_t)&type) == 1, "unknown memory: cuPointerGetAttribute refuses");
	CHECK(cuMemFreeHost(pinned) == 0, "free pinned");

	/* --- virtual memory management as PyTorch's expandable segments use it */
	struct {
		int type, handleTypes, locType, locID;
		void *win32;
		uint8_t flags[8];
	} prop = {1 /* PINNED */, 0, 1 /* DEVICE */, 0, NULL, {0}};
	struct {
		int locType, locID, flags;
	} access = {1, 0, 3 /* READWRITE */};
	size_t gran = 0;
	CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0) == 0 && gran > 0, "granularity %zu", gran);
	dptr base = 0;
	unsigned long long ph = 0, ph2 = 0;
	CHECK(cuMemAddressReserve(&base, 8 * gran, 0, 0, 0) == 0 && base != 0, "reserve");
	CHECK(cuMemCreate(&ph, 2 * gran, &prop, 0) == 0 && cuMemCreate(&ph2, gran, &prop, 0) == 0, "create");
	CHECK(cuMemMap(base + 2 * gran, 2 * gran, 0, ph, 0) == 0, "map");
	CHECK(cuMemMap(base + 3 * gran, gran, 0, ph2, 0) == 1, "a mapping over another is refused");
	CHECK(cuMemMap(base + 8 * gran, gran, 0, ph2, 0) == 1, "a mapping outside the reservation is refused");
	CHECK(cuMemMap(base, gran, 0, ph2, 0) == 0, "a second mapping");
	CHECK(cuMemSetAccess(base + 2 * gran, 2 * gran, &access, 1) == 0 && cuMemSetAccess(base, gran, &access, 1) == 0,
	      "access");
	static uint8_t page[1 << 16], page2[1 << 16];
	for (size_t i = 0; i < sizeof page; i++) page[i] = (uint8_t)(i * 13 + 5);
	dptr at = base + 2 * gran + gran - 100; /* across the middle of the mapping */
	CHECK(cuMemcpyHtoD_v2(at, page, sizeof page) == 0 && cuMemcpyDtoH_v2(page2, at, sizeof page2) == 0 &&
		  memcmp(page, page2, sizeof page) == 0,
	      "bytes through the mapping");
	CHECK(cuPointerGetAttribute(&mt, 2, at) == 0 && mt == 2, "a mapping is device memory");
	CHECK(cuMemcpyHtoD_v2(base + gran, page, 16) == 1, "the unmapped middle of the reservation is refused");
	CHECK(cuMemAddressFree(base, 8 * gran) == 1, "a reservation with mappings cannot be freed");
	CHECK(cuMemUnmap(base + 2 * gran, 2 * gran) == 0, "unmap");
	CHECK(cuMemcpyHtoD_v2(at, page, 16) == 1, "unmapped memory is refused");
	CHECK(cuMemMap(base + 2 * gran, 2 * gran, 0, ph, 0) == 0 && cuMemcpyHtoD_v2(at, page, 16) == 0,
	      "the same address mapped again");
	CHECK(cuMemUnmap(base, 4 * gran) == 0, "unmap both");
	CHECK(cuMemRelease(ph) == 0 && cuMemRelease(ph2) == 0 && cuMemAddressFree(base, 8 * gran) == 0, "release");
	CHECK(cuMemFree_v2(d) == 0 && cuMemFree_v2(d2) == 0 && cuCtxSynchronize() == 0, "free");
	if (failures) {
		printf("%d failure(s)\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}

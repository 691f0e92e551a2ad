// runtime.cu: a CUDA C++ program of the runtime API, built with the pinned wheel's nvcc and run through the shim on
// the simulated node (test/cuda). Its kernels are the simulated device's reference kernels (extern "C", the
// parameter layouts the sim computes), written as real CUDA so that the same program runs on a GPU. It prints
// "ok" and exits 0 when every result is exact.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void fill(float *p, float v, unsigned n) {
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) p[i] = v;
}

extern "C" __global__ void scale(float *p, float alpha, unsigned n) {
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) p[i] *= alpha;
}

__device__ float table[256];
__device__ unsigned counter = 7;

#define CHECK(x)                                                                                              \
	do {                                                                                                   \
		cudaError_t e = (x);                                                                           \
		if (e != cudaSuccess) {                                                                        \
			printf("line %d: %s: %s\n", __LINE__, #x, cudaGetErrorString(e));                      \
			return 1;                                                                              \
		}                                                                                              \
	} while (0)

#define EXPECT(cond, ...)                                                                                     \
	do {                                                                                                   \
		if (!(cond)) {                                                                                 \
			printf("line %d: ", __LINE__);                                                         \
			printf(__VA_ARGS__);                                                                   \
			printf("\n");                                                                          \
			return 1;                                                                              \
		}                                                                                              \
	} while (0)

int main() {
	const unsigned n = 100000;
	int count = 0;
	CHECK(cudaGetDeviceCount(&count));
	EXPECT(count == 1, "%d devices", count);
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

	static float a[n], b[n], c[n];
	for (unsigned i = 0; i < n; i++) {
		a[i] = (float)i * 0.5f;
		b[i] = (float)(n - i) * 0.25f;
	}
	float *da, *db, *dc;
	CHECK(cudaMalloc(&da, n * sizeof(float)));
	CHECK(cudaMalloc(&db, n * sizeof(float)));
	CHECK(cudaMalloc(&dc, n * sizeof(float)));
	CHECK(cudaMemcpy(da, a, n * sizeof(float), cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(db, b, n * sizeof(float), cudaMemcpyHostToDevice));
	vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
	CHECK(cudaGetLastError());
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaMemcpy(c, dc, n * sizeof(float), cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(c[i] == a[i] + b[i], "c[%u] = %g, want %g", i, c[i], a[i] + b[i]);

	// A stream: fill, scale and copy back in order, timed with events.
	cudaStream_t s;
	cudaEvent_t start, stop;
	CHECK(cudaStreamCreate(&s));
	CHECK(cudaEventCreate(&start));
	CHECK(cudaEventCreate(&stop));
	CHECK(cudaEventRecord(start, s));
	fill<<<(n + 127) / 128, 128, 0, s>>>(dc, 3.0f, n);
	scale<<<(n + 127) / 128, 128, 0, s>>>(dc, -1.5f, n);
	CHECK(cudaEventRecord(stop, s));
	float *pinned;
	CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
	CHECK(cudaMemcpyAsync(pinned, dc, n * sizeof(float), cudaMemcpyDeviceToHost, s));
	CHECK(cudaStreamSynchronize(s));
	CHECK(cudaEventSynchronize(stop));
	float ms = -1;
	CHECK(cudaEventElapsedTime(&ms, start, stop));
	EXPECT(ms >= 0, "elapsed %g ms", ms);
	for (unsigned i = 0; i < n; i++) EXPECT(pinned[i] == -4.5f, "pinned[%u] = %g, want -4.5", i, pinned[i]);

	// Device-to-device and a memset on the default stream.
	CHECK(cudaMemcpy(db, da, n * sizeof(float), cudaMemcpyDeviceToDevice));
	CHECK(cudaMemset(da, 0, n * sizeof(float)));
	CHECK(cudaMemcpy(c, db, n * sizeof(float), cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(c[i] == a[i], "copy: c[%u] = %g, want %g", i, c[i], a[i]);
	CHECK(cudaMemcpy(c, da, n * sizeof(float), cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(c[i] == 0, "memset: c[%u] = %g", i, c[i]);

	// Module globals: cudaMemcpyToSymbol and back, and the initial value of an initialised one.
	float t[256];
	for (int i = 0; i < 256; i++) t[i] = (float)(i * i) - 7.25f;
	CHECK(cudaMemcpyToSymbol(table, t, sizeof t));
	float back[256];
	CHECK(cudaMemcpyFromSymbol(back, table, sizeof back));
	EXPECT(memcmp(t, back, sizeof t) == 0, "table came back different");
	unsigned cnt = 0;
	CHECK(cudaMemcpyFromSymbol(&cnt, counter, sizeof cnt));
	EXPECT(cnt == 7, "counter = %u, want 7", cnt);
	float *sym = nullptr;
	CHECK(cudaGetSymbolAddress((void **)&sym, table));
	scale<<<1, 256>>>(sym, 2.0f, 256);
	CHECK(cudaMemcpyFromSymbol(back, table, sizeof back));
	for (int i = 0; i < 256; i++) EXPECT(back[i] == 2 * t[i], "table[%d] = %g, want %g", i, back[i], 2 * t[i]);

	size_t free_b = 0, total_b = 0;
	CHECK(cudaMemGetInfo(&free_b, &total_b));
	EXPECT(free_b <= total_b && total_b > 0, "memory %zu of %zu", free_b, total_b);
	CHECK(cudaFreeHost(pinned));
	CHECK(cudaFree(da));
	CHECK(cudaFree(db));
	CHECK(cudaFree(dc));
	CHECK(cudaStreamDestroy(s));
	CHECK(cudaEventDestroy(start));
	CHECK(cudaEventDestroy(stop));
	CHECK(cudaDeviceSynchronize());
	printf("ok\n");
	return 0;
}

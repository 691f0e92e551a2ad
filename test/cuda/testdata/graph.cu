// graph.cu: CUDA graphs through the runtime API, built with the pinned wheel's nvcc and run through the shim on the
// simulated node (test/cuda, TestCUDAGraphProgram). Its kernels are the simulated device's reference kernels, so
// every replay of a captured graph is computed and checked exactly. It captures a stream (the capture queries
// answering the real state while it runs), instantiates, launches the graph several times with inputs changed in
// between, updates the executable graph from a second capture, checks that a capture holding a device-to-host copy
// is invalidated, and prints the node counts and "ok".
#include <cstdio>
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

static const unsigned n = 4096;

// step records, on s: c = a + b; c *= alpha; b = c (a device-to-device copy); a[0..n) = 1.0 by memset of bytes
// 0x00 then fill(a, 1); so that each replay changes the state the next one reads.
static void step(cudaStream_t s, float *a, float *b, float *c, float alpha) {
	vector_add<<<n / 256, 256, 0, s>>>(a, b, c, n);
	scale<<<n / 256, 256, 0, s>>>(c, alpha, n);
	cudaMemcpyAsync(b, c, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
	cudaMemsetAsync(a, 0, n * sizeof(float), s);
	fill<<<n / 256, 256, 0, s>>>(a, 1.0f, n);
}

int main() {
	float *a, *b, *c;
	CHECK(cudaMalloc(&a, n * sizeof(float)));
	CHECK(cudaMalloc(&b, n * sizeof(float)));
	CHECK(cudaMalloc(&c, n * sizeof(float)));
	static float host[n], want[n];
	for (unsigned i = 0; i < n; i++) host[i] = (float)i;
	CHECK(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(b, host, sizeof host, cudaMemcpyHostToDevice));

	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	cudaStreamCaptureStatus st;
	CHECK(cudaStreamIsCapturing(s, &st));
	EXPECT(st == cudaStreamCaptureStatusNone, "status before capture %d", (int)st);

	cudaGraph_t g;
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	CHECK(cudaStreamIsCapturing(s, &st));
	EXPECT(st == cudaStreamCaptureStatusActive, "status while capturing %d", (int)st);
	unsigned long long id = 0;
	CHECK(cudaStreamGetCaptureInfo(s, &st, &id));
	EXPECT(st == cudaStreamCaptureStatusActive && id != 0, "capture info %d id %llu", (int)st, id);
	step(s, a, b, c, 2.0f);
	CHECK(cudaGetLastError());
	CHECK(cudaStreamEndCapture(s, &g));
	CHECK(cudaStreamIsCapturing(s, &st));
	EXPECT(st == cudaStreamCaptureStatusNone, "status after capture %d", (int)st);
	size_t nodes = 0;
	CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
	printf("graph: %zu nodes\n", nodes);
	EXPECT(nodes == 5, "%zu nodes, want 5", nodes);

	// Capturing ran nothing.
	CHECK(cudaMemcpy(want, b, sizeof want, cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(want[i] == (float)i, "b[%u] = %g after capture", i, want[i]);

	cudaGraphExec_t exec;
	CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
	float ha[n], hb[n];
	for (unsigned i = 0; i < n; i++) ha[i] = (float)i, hb[i] = (float)i;
	for (int launch = 0; launch < 3; launch++) {
		CHECK(cudaGraphLaunch(exec, s));
		for (unsigned i = 0; i < n; i++) {
			hb[i] = (ha[i] + hb[i]) * 2.0f;
			ha[i] = 1.0f;
		}
	}
	CHECK(cudaStreamSynchronize(s));
	CHECK(cudaMemcpy(want, b, sizeof want, cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(want[i] == hb[i], "b[%u] = %g after 3 launches, want %g", i, want[i], hb[i]);
	CHECK(cudaMemcpy(want, c, sizeof want, cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(want[i] == hb[i], "c[%u] = %g, want %g", i, want[i], hb[i]);

	// An update: the same nodes with another alpha.
	cudaGraph_t g2;
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	step(s, a, b, c, -0.5f);
	CHECK(cudaStreamEndCapture(s, &g2));
	cudaGraphExecUpdateResultInfo info;
	CHECK(cudaGraphExecUpdate(exec, g2, &info));
	EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result %d", (int)info.result);
	CHECK(cudaGraphLaunch(exec, s));
	for (unsigned i = 0; i < n; i++) hb[i] = (ha[i] + hb[i]) * -0.5f;
	CHECK(cudaStreamSynchronize(s));
	CHECK(cudaMemcpy(want, b, sizeof want, cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(want[i] == hb[i], "b[%u] = %g after the update, want %g", i, want[i], hb[i]);

	// A graph of another shape does not fit the executable graph.
	cudaGraph_t g3;
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	scale<<<n / 256, 256, 0, s>>>(c, 3.0f, n);
	CHECK(cudaStreamEndCapture(s, &g3));
	cudaError_t e = cudaGraphExecUpdate(exec, g3, &info);
	EXPECT(e == cudaErrorGraphExecUpdateFailure && info.result == cudaGraphExecUpdateErrorTopologyChanged,
	       "update with another topology: %s, result %d", cudaGetErrorString(e), (int)info.result);
	cudaGetLastError();

	// A copy to the host cannot be captured: the capture is invalidated and ends without a graph.
	cudaGraph_t g4 = nullptr;
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	scale<<<n / 256, 256, 0, s>>>(c, 3.0f, n);
	e = cudaMemcpyAsync(host, c, sizeof host, cudaMemcpyDeviceToHost, s);
	cudaError_t end = cudaStreamEndCapture(s, &g4);
	EXPECT(end == cudaErrorStreamCaptureInvalidated && g4 == nullptr, "capture with a copy to the host: %s / %s",
	       cudaGetErrorString(e), cudaGetErrorString(end));
	cudaGetLastError();
	// The stream works as before, and the invalidated capture ran nothing.
	CHECK(cudaMemcpy(want, c, sizeof want, cudaMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) EXPECT(want[i] == hb[i], "c[%u] = %g after the invalid capture", i, want[i]);

	CHECK(cudaGraphExecDestroy(exec));
	CHECK(cudaGraphDestroy(g));
	CHECK(cudaGraphDestroy(g2));
	CHECK(cudaGraphDestroy(g3));
	CHECK(cudaStreamDestroy(s));
	printf("ok\n");
	return 0;
}

// fat.cu: a module the fatbin tests compile into fat binaries for several targets and compression modes with the
// pinned wheel's nvcc (nothing NVIDIA built is checked in). The table makes the cubins large enough to compress.
__device__ float table[4096] = {1.0f, 2.0f, 3.0f};

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i] + table[i % 4096];
}

template <int N> __global__ void unrolled(float *x) {
#pragma unroll
  for (int i = 0; i < N; i++) x[threadIdx.x * N + i] *= table[i];
}
template __global__ void unrolled<64>(float *);
template __global__ void unrolled<128>(float *);

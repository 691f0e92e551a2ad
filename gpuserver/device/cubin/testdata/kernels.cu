// kernels.cu: kernels and module globals whose layouts the cubin tests know from the C++ types. The tests compile
// it with the pinned wheel's nvcc at test time (nothing NVIDIA built is checked in).
#include <cstdint>

struct S3 { char c[3]; };                      // size 3, align 1
struct alignas(16) V4 { float x, y, z, w; };   // size 16, align 16
struct Big { int a[1000]; };                   // size 4000, align 4

__device__ int counter;                                   // zero-initialised: .nv.global
__device__ float table[5] = {1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
__device__ double dscalar = 3.25;
__constant__ int cvals[4] = {7, 8, 9, 10};                // .nv.constant3
__device__ int *ptr_to_counter = &counter;                // an address: a relocation
__device__ __managed__ int managed_v = 42;

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void set_counter(int v) { counter = v + cvals[0]; }

__global__ void mixed(char a, short b, int c, long long d, float e, double f, S3 s, V4 v, void *p) {
  if (a) *(double *)p = b + c + d + e + f + s.c[1] + v.w;
}

template <typename T> __global__ void tmpl(T *x, T y) { x[threadIdx.x] = y + table[threadIdx.x % 5] + dscalar; }
template __global__ void tmpl<float>(float *, float);
template __global__ void tmpl<double>(double *, double);

__global__ void big(Big b, int *out) { out[threadIdx.x] = b.a[threadIdx.x] + *ptr_to_counter + managed_v; }

extern "C" __global__ void noparams() { counter++; }

extern "C" __global__ void __launch_bounds__(128) shared_user(float *x) {
  __shared__ float s[256];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = s[255 - threadIdx.x];
}

extern "C" __global__ void local_user(int *x, int n) {
  int buf[256];  // indexed by a runtime value: local memory (a stack frame)
  for (int i = 0; i < 256; i++) buf[i] = x[i] * n;
  x[0] = buf[x[n] & 255];
}

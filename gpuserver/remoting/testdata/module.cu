// module.cu: a module built with the pinned wheel's nvcc at test time, whose kernels the simulated GPU computes by
// the matching rule of package sim (extern "C" reference kernels, set_<global>) beside one it cannot compute.
__device__ float result;
__device__ float bias[4] = {0.5f, 1.5f, 2.5f, 3.5f};

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void set_result(float v) { result = v; }

__global__ void add_bias(float *x, unsigned n) {  // C++: the sim cannot compute it
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += bias[i % 4];
}

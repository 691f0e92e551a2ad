// Package sim is a simulated GPU node behind the device.Backend interface: device memory is host memory, the node's
// links (PCIe per GPU, shared PCIe switch uplinks, NVLink bandwidth matrix, copy engines) come from a
// topology.Node and its one link model (topology.Node.TransferTime), and every copy, memset and kernel takes its
// modelled time on an injectable Clock, multiplied by Options.TimeScale (0 runs without delays, for tests). Work
// is really done: bytes are copied, and the reference kernels compute on the simulated device memory, so data
// movement and results can be checked end to end without a GPU. Addresses behave as with CUDA's virtual memory
// management: a reservation is valid on every GPU, a physical allocation belongs to one GPU, and a stream's GPU
// may touch a mapped range only after SetAccess granted it (peer access needs CanAccessPeer).
//
// # Modules
//
// LoadModule takes the images the CUDA driver takes from cuModuleLoadData, cuModuleLoadFatBinary and
// cuLibraryLoadData: PTX text, a cubin (the ELF ptxas writes), or a fat binary (what nvcc embeds and the NVIDIA
// libraries ship, stored, LZ4- or Zstandard-compressed: packages fatbin and cubin). The image bytes are the fat
// binary itself (16 + the size in its header), never the __fatBinC_Wrapper_t pointing to it (refused with a
// message saying so). A simulated GPU has the compute capability of its topology.GPU (v100x4: 7.0, a100x8: 8.0,
// h100x8 and h200x1: 9.0; 7.0 when a node file does not say), and the image is chosen as the driver chooses it:
//
//   - from a fat binary, a cubin of the GPU's major version and a minor version not above the GPU's (an
//     arch-specific sm_90a cubin only on exactly 9.0), the highest, the most specific on a tie; else the PTX of
//     the highest virtual architecture not above the GPU's; else the load fails with device.ErrNoBinaryForGPU
//     (CUDA_ERROR_NO_BINARY_FOR_GPU), naming the targets the fat binary holds. (The PyTorch 2.11 cu130 wheels
//     hold sm_75 to sm_121 cubins and no PTX, so their modules do not load on a simulated V100: CUDA 13 dropped
//     sm_70, as it does on a real V100.)
//   - a cubin alone must be for the GPU's major version and a minor version not above the GPU's, or the load
//     fails with device.ErrNoBinaryForGPU.
//   - PTX would be compiled just in time by the driver. The sim compiles nothing: loading PTX reads its entries'
//     parameter layouts and its module variables, exactly as for a cubin, and does not check its .target.
//
// A module's kernels are found by name (the mangled name, or the plain name of an extern "C" kernel) with their
// parameter layout: offset and size of every parameter in the argument buffer, as cuFuncGetParamInfo reports it
// (from EIATTR_KPARAM_INFO for a cubin, from the .param list for PTX). Functions of cubins also know their
// registers, static shared and local memory and launch bound (device.AttributedFunction). Module globals -
// __device__, __constant__ and __managed__ variables - get memory on the module's GPU (at an address of their own
// per GPU, as on a real driver) holding their initial values, with the addresses a pointer-valued initialiser
// (`__device__ int *p = &x;`) asks for; Module.Global finds them by name (cuModuleGetGlobal, cudaMemcpyToSymbol).
//
// # Which kernels run
//
// The sim computes its reference kernels, with float32 data in row-major order; a thread index covers one element
// (one output element for matmul and linear: x = column, y = row), and elements beyond the launched grid are left
// alone, as on a GPU:
//
//	vector_add(const float* a, const float* b, float* c, unsigned n)              c[i] = a[i] + b[i]
//	matmul(const float* a, const float* b, float* c, unsigned m, unsigned n, unsigned k)
//	                                                                             c[m x n] = a[m x k] b[k x n]
//	linear(const float* x, const float* w, const float* b, float* y, unsigned m, unsigned n, unsigned k)
//	                                                                             y[m x n] = x[m x k] w[k x n] + b[n]
//	relu(const float* x, float* y, unsigned n)                                   y[i] = max(x[i], 0)
//	fill(float* x, float v, unsigned n)                                          x[i] = v
//	scale(float* x, float alpha, unsigned n)                                     x[i] = alpha x[i]
//	set_<g>(T v)                                                                 g = v
//	busy(unsigned long long ns)                                                  takes ns of GPU time
//
// The matching rule, the same for PTX, cubins and fat binaries (the sim/kernels module, or a module nvcc built):
//
//   - A kernel is computed as the reference kernel of its name when its symbol name is exactly that name (so an
//     extern "C" kernel: `extern "C" __global__ void vector_add(const float*, const float*, float*, unsigned)`)
//     and its parameter layout is exactly the reference kernel's: pointers are 8-byte parameters, unsigned and
//     float 4-byte ones, each at the next multiple of its size (vector_add: offsets 0, 8, 16, 24). Pointers may
//     point to any device memory, module globals included (cudaGetSymbolAddress, cuModuleGetGlobal).
//   - A kernel named set_<g> with a single parameter, in a module with a global <g> exactly as large as that
//     parameter, stores its argument into <g> on the launching GPU: `__device__ int counter; extern "C"
//     __global__ void set_counter(int v) { counter = v; }` (what cudaMemcpyFromSymbol then reads).
//   - Every other kernel (a C++ kernel, one named like a reference kernel with another layout, PyTorch's and
//     cuBLAS's) loads, can be looked up and reports its layout, but launching it fails with ErrKernelNotSimulated
//     (wrapping device.ErrNotSupported: CUDA_ERROR_NOT_SUPPORTED through the shim) and a message naming it, its
//     module and, for a name-alike, how its layout differs - unless the backend runs with Options.Kernels =
//     KernelsDry (the gpuserver's --sim-kernels=dry, a protocol-test option that is never a default): then such
//     a launch is accepted, takes the launch latency and changes no memory, and DryLaunches counts it.
//
// # Timed mode
//
// With TimeScale > 0 the sim keeps modelled time on the wall clock (or Options.Clock), scaled by TimeScale: it is
// the timed virtual GPU the remoting path is measured on (docs/design.md, decision 8; test/bench/replay). Each GPU has
// one compute engine: kernels, memsets and local copies of all its streams run on it one after another, each
// starting at the latest of its enqueueing, the end of the previous work of its stream (or of an event it waits
// for) and the end of the engine's previous work. They take no wall-clock time when the stream reaches them;
// what observes their completion waits until their modelled end: a stream's or an event's Synchronize (with
// device.Wait, as the cuda backend waits for the driver, so that a benchmark pays the backend's waiting), an
// event's Query and Elapsed. Copies over links (host to device, device to host, peer) hold their link for their
// modelled time, so that concurrent transfers share it. A kernel's time is, in this order: its argument for busy;
// the Profile's time for its name (recorded on a real GPU); for a reference kernel the launch latency plus the
// larger of its memory and float time; for a dry kernel the Profile's Launch time, else the launch latency.
//
// # Co-running functions (compute shares)
//
// Functions that share a GPU (gpuserver/compute) co-run on it in this model as follows. Co-runners of one tenant
// run in one executor process, so their streams' work lands on the one engine of the GPU: it runs concurrently in
// the sense that both streams progress at once, each kernel taking its own time, and the engine is time-sliced
// between them in the order their gates release work. Each stream's meter (its ComputeWork: the engine time its
// work occupied) is what its gate's tokens count, so over every period a co-runner at share s receives s of the
// engine; the slowdown a co-runner sees is 1/s on its GPU phase (a kernel cycle of G alone takes G/s beside busy
// neighbours, less while they idle), with the kernels of the others interleaved between its own. Co-runners of
// different tenants run in different executor processes, each with a virtual GPU of its own: nothing on the
// virtual GPUs makes them contend, the gpuserver's grants do (they issue at most one period of GPU time per
// period over all the processes), so the same 1/s holds across processes.
//
// What this assumes: a kernel occupies the whole GPU while it runs (the time-sliced contexts of a real driver
// without MPS, or small kernels that do not overlap); two small kernels that would run side by side on idle
// multiprocessors (streams of one process on a real GPU, green contexts) are not modelled, so a figure measured
// here is a lower bound for them; and the slowdown is linear in the share, not calibrated against a profile of
// latency against share (Dilu's 10-point steps). Switching contexts costs nothing here.
package sim

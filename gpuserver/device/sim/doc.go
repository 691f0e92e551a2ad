// Package sim is a simulated GPU node behind the device.Backend interface: device memory is host memory, the node's
// links (PCIe per GPU, shared PCIe switch uplinks, NVLink bandwidth matrix, copy engines) come from a
// topology.Node and its one link model (topology.Node.TransferTime), and every copy, memset and kernel takes its
// modelled time on an injectable Clock, multiplied by Options.TimeScale (0 runs without delays, for tests). Work
// is really done: bytes are copied, and the reference kernels compute on the simulated device memory, so data
// movement and results can be checked end to end without a GPU. Addresses behave as with CUDA's virtual memory
// management: a reservation is valid on every GPU, a physical allocation belongs to one GPU, and a stream's GPU
// may touch a mapped range only after SetAccess granted it (peer access needs CanAccessPeer).
//
// # Reference kernels
//
// A module is PTX text (see package sim/kernels for the checked-in module); its `.entry` lines give each kernel's
// name and parameter layout (package device/ptx). The sim runs these kernels, recognised by name, with float32 data
// in row-major order; a thread index covers one element (one output element for matmul and linear: x = column,
// y = row), and elements beyond the launched grid are left alone, as on a GPU:
//
//	vector_add(const float* a, const float* b, float* c, unsigned n)              c[i] = a[i] + b[i]
//	matmul(const float* a, const float* b, float* c, unsigned m, unsigned n, unsigned k)
//	                                                                             c[m x n] = a[m x k] b[k x n]
//	linear(const float* x, const float* w, const float* b, float* y, unsigned m, unsigned n, unsigned k)
//	                                                                             y[m x n] = x[m x k] w[k x n] + b[n]
//	relu(const float* x, float* y, unsigned n)                                   y[i] = max(x[i], 0)
//	fill(float* x, float v, unsigned n)                                          x[i] = v
//	scale(float* x, float alpha, unsigned n)                                     x[i] = alpha x[i]
//
// Pointers are 8-byte parameters, unsigned and float 4-byte ones, at the offsets the PTX declares (for these
// kernels: consecutive, each aligned to its size). Any other entry of a module can be looked up (its layout is
// known) but launching it fails with device.ErrNotSupported. Module globals (`.global` variables) get memory on
// the module's GPU at an address of their own per GPU, as on a real driver.
package sim

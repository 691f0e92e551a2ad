// Package device is the contract between the gpuserver and a node's GPUs. A Backend drives every GPU of the node
// through one driver: the cuda backend (package device/cuda) loads the NVIDIA driver at run time, the sim backend
// (package device/sim) models a node in software over host memory. Everything above it (the memory manager, the
// executors, the remoting server that replays a function's CUDA driver calls) is written against this package
// only, so it builds and is tested without a GPU.
//
// The interface follows the CUDA driver API closely so that the remoting server can dispatch a remoted call onto it
// one to one:
//
//   - Virtual memory management (docs/design.md, decision 2). ReserveAddress reserves a range of the node's unified
//     device address space; the range is valid on every GPU. CreatePhysical allocates physical memory on one GPU
//     (a multiple of that GPU's Granularity), Map maps a whole physical allocation at an address inside a
//     reservation, SetAccess makes a mapped range readable and writable by a set of GPUs, Unmap removes the mapping.
//     An address range is mapped to at most one physical allocation at a time, so a function whose blocks live at
//     fixed addresses executes on one GPU at a time; other GPUs may keep its bytes in physical memory that is
//     mapped elsewhere (for example at a staging address) as a swap source.
//   - Streams order asynchronous work on one GPU: host-to-device, device-to-host and device-to-device copies
//     (a device-to-device copy may read from another GPU's memory when SetAccess granted the stream's GPU access
//     to it: a peer copy), memsets, kernel launches, event records and waits. An error of an asynchronous
//     operation is reported by the next Synchronize of the stream (or of an event recorded after it).
//   - Modules are loaded per GPU from an image (PTX text or a cubin). Their functions are looked up by name and
//     know their parameter layout (offset and size of each parameter in the argument buffer). A kernel is launched
//     with a raw argument buffer laid out as those parameters, exactly as the CUDA driver receives it through
//     CU_LAUNCH_PARAM_BUFFER_POINTER; the remoting server passes it through unchanged. Pointers in it are device
//     addresses and need no translation, because blocks keep their address on every GPU.
//   - Module globals are the exception: Module.Global returns an address that differs per GPU the module is
//     loaded on (the trap docs/design.md ends with); callers translate a global per GPU.
//
// Host memory handed to asynchronous copies must stay valid and unchanged until the stream has passed the copy.
// For copies to run truly asynchronously on the cuda backend it must be page-locked: memory from RegisterHost
// (the model repository registers its shared-memory images), otherwise the driver stages it.
//
// GPUs are identified by their index in GPUs(), from 0. Methods are safe for concurrent use unless stated.
package device

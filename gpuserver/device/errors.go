package device

import (
	"errors"
	"fmt"
)

// Sentinel errors of every backend; backends wrap them with %w and the driver's own code and message.
var (
	// ErrUnavailable: the driver cannot be loaded or initialised, or the node has no GPU.
	ErrUnavailable = errors.New("device unavailable")
	// ErrInvalidValue: a bad argument (GPU index, size, alignment, address, argument buffer).
	ErrInvalidValue = errors.New("invalid value")
	// ErrOutOfMemory: no physical memory or address space left.
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrNotFound: no such kernel or global in a module.
	ErrNotFound = errors.New("not found")
	// ErrIllegalAddress: work touched an address not mapped or not accessible from its GPU (or its context). A
	// context fault: sticky for the context the work ran in (see Context).
	ErrIllegalAddress = errors.New("illegal address")
	// ErrKernelFault: a kernel failed on the GPU (illegal instruction, misaligned address, trap, assert, launch
	// failure). A context fault: sticky for the context the work ran in (see Context).
	ErrKernelFault = errors.New("kernel fault")
	// ErrNotSupported: the operation is not supported by this backend or GPU (e.g. peer access).
	ErrNotSupported = errors.New("not supported")
	// ErrInvalidImage: a module image that cannot be loaded.
	ErrInvalidImage = errors.New("invalid module image")
	// ErrNotReady: the work an event or query waits for has not completed yet.
	ErrNotReady = errors.New("not ready")
	// ErrNoBinaryForGPU: a well-formed module image with no code for the GPU's architecture
	// (CUDA_ERROR_NO_BINARY_FOR_GPU).
	ErrNoBinaryForGPU = errors.New("no binary for the GPU")
	// ErrKernelNotSimulated: a kernel the simulated node cannot compute (outside its reference kernels, without
	// --sim-kernels=dry); it wraps ErrNotSupported (CUDA_ERROR_NOT_SUPPORTED to the function), and the remoting
	// path tells the shim it apart so that the function can answer what the simulated node cannot do.
	ErrKernelNotSimulated = fmt.Errorf("%w: kernel not simulated", ErrNotSupported)
)

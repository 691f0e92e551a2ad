package device

// FunctionAttributes are a kernel's static resources as its image records them: what cuFuncGetAttribute answers
// for CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, SHARED_SIZE_BYTES, LOCAL_SIZE_BYTES, NUM_REGS and BINARY_VERSION.
type FunctionAttributes struct {
	// MaxThreadsPerBlock the kernel was compiled for (__launch_bounds__); 0 when it declares no limit (the
	// device's then applies).
	MaxThreadsPerBlock int `json:"max_threads_per_block"`
	// SharedSizeBytes of static shared memory.
	SharedSizeBytes uint64 `json:"shared_size_bytes"`
	// LocalSizeBytes of local memory per thread.
	LocalSizeBytes uint64 `json:"local_size_bytes"`
	// NumRegs per thread.
	NumRegs int `json:"num_regs"`
	// BinaryVersion is the architecture of the code, major*10+minor (0 when the image is PTX).
	BinaryVersion int `json:"binary_version"`
}

// AttributedFunction is a Function that knows its FunctionAttributes from its image (the sim's functions of
// cubins and fat binaries; PTX-only functions report zeros).
type AttributedFunction interface {
	Function
	Attributes() FunctionAttributes
}

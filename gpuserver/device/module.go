package device

// Param is one kernel parameter's place in the raw argument buffer.
type Param struct {
	// Offset of the parameter in the argument buffer, in bytes.
	Offset uint32 `json:"offset"`
	// Size of the parameter in bytes (8 for a pointer).
	Size uint32 `json:"size"`
}

// ArgsSize is the size of an argument buffer holding params (the end of the last parameter).
func ArgsSize(params []Param) uint32 {
	var end uint32
	for _, p := range params {
		end = max(end, p.Offset+p.Size)
	}
	return end
}

// Module is a module image loaded on one GPU.
type Module interface {
	// GPU the module is loaded on.
	GPU() int
	// Function returns the kernel called name (its mangled or extern "C" name); ErrNotFound if absent.
	Function(name string) (Function, error)
	// Global returns the address and size of the module global called name on this module's GPU. The address
	// differs per GPU the module is loaded on. ErrNotFound if absent.
	Global(name string) (Ptr, uint64, error)
	// Unload releases the module; its functions become invalid.
	Unload() error
}

// Function is a kernel of a loaded module.
type Function interface {
	// Name of the kernel as in the module.
	Name() string
	// Params is the kernel's parameter layout, in declaration order.
	Params() []Param
}

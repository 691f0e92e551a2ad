package device

import "errors"

// Context is an isolation domain on one GPU: a CUDA context. Streams, events and modules created from it run in
// it, and a module's memory (its code and globals) belongs to its context.
//
// What a context does and does not isolate (docs/security.md has the whole argument):
//
//   - Faults. A fault of work in a context (ErrIllegalAddress, ErrKernelFault: an illegal address, instruction or
//     alignment, a trap, an assert) is sticky for that context: every later operation in it fails with the same
//     error and only Destroy is left. Other contexts, the backend's own streams and the GPU stay in service, so a
//     caller that gives each tenant its own context confines the damage of one tenant's bad kernel to that tenant.
//   - Memory mapped through Backend.Map is the process's, not a context's: SetAccess grants it to a GPU, and work
//     of every context on that GPU can reach it (that is how the driver's virtual memory management works: access
//     is per device, the address space is the process's). Contexts therefore do not keep tenants' mapped memory
//     apart; the caller must never have two tenants' memory accessible on a GPU at the same time (package
//     executor maps one tenant's memory on a GPU at a time).
//   - Module memory is allocated in its context and is not reachable from other contexts.
type Context interface {
	// GPU the context belongs to.
	GPU() int
	// NewStream creates a stream of the context.
	NewStream() (Stream, error)
	// NewEvent creates an event of the context.
	NewEvent() (Event, error)
	// LoadModule loads a module image in the context.
	LoadModule(image []byte) (Module, error)
	// Err returns the sticky fault that poisoned the context, nil while it is usable.
	Err() error
	// Destroy releases the context and everything created from it (streams, events, modules). It works on a
	// poisoned context.
	Destroy() error
}

// IsContextFault reports whether err is a fault of work in a context: sticky for that context and harmless to
// the GPU and to other contexts.
func IsContextFault(err error) bool {
	return errors.Is(err, ErrIllegalAddress) || errors.Is(err, ErrKernelFault)
}

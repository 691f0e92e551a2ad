package device

import "os"

// Sharer is a Backend whose physical memory can be mapped by another process: the gpuserver lends physical chunks
// to tenant executor processes (docs/tenants.md). ExportPhysical returns a new file descriptor for a physical
// allocation of this backend (the cuda backend: a POSIX file descriptor from cuMemExportToShareableHandle, for
// memory created shareable; the sim: the memfd holding the allocation's bytes); the caller closes it after passing
// it on. ImportPhysical makes a physical allocation of GPU gpu from a descriptor another process exported
// (cuMemImportFromShareableHandle; the sim maps the memfd); the descriptor may be closed afterwards. Releasing an
// imported allocation drops this process's reference only: the exporter's allocation and its bytes stay.
type Sharer interface {
	ExportPhysical(p Physical) (*os.File, error)
	ImportPhysical(gpu int, size uint64, f *os.File) (Physical, error)
}

package handoff

import "github.com/faas-gpu/faas-gpu/gpuserver/topology"

// The start hand-off: the first frame on a new executor's control socket is KindStart from the gpuserver, carrying
// everything the executor process needs (it reads no flags or environment of its own beyond its log level); the
// executor answers with Started once it serves, or an error naming what failed (a device it cannot open, a
// repository directory it cannot use).
const KindStart Kind = 1

// Start configures a tenant executor.
type Start struct {
	// Tenant is the tenant the executor serves ("namespace/team-a", "function/name.ns").
	Tenant string `json:"tenant"`
	// Generation counts the executors started for the tenant, from 1; a restarted executor has a higher one.
	Generation int `json:"generation"`
	// Device is the backend the executor opens.
	Device Device `json:"device"`
	// ChunkSize is the size of the chunks the gpuserver lends; Chunks the number of chunks of each GPU.
	ChunkSize uint64 `json:"chunk_size"`
	Chunks    []int  `json:"chunks"`
	// WindowBase and WindowSize are the tenant's device address window: every segment of its functions is
	// reserved inside it (docs/tenants.md, the address plan).
	WindowBase uint64 `json:"window_base"`
	WindowSize uint64 `json:"window_size"`
	// RepositoryDir is the tenant's own image directory.
	RepositoryDir string `json:"repository_dir"`
	// GroupBytes is the swap group size (0: the executor's default).
	GroupBytes uint64 `json:"group_bytes,omitempty"`
	// LogLevel of the executor's log ("debug", "info", "warn", "error"); it logs to its stderr, which the
	// gpuserver passes through.
	LogLevel string `json:"log_level,omitempty"`
	// Functions are the tenant's registered functions (a restarted executor registers them again).
	Functions []Function `json:"functions,omitempty"`
}

// Device names the backend of an executor.
type Device struct {
	// Kind is "sim" or "cuda".
	Kind string `json:"kind"`
	// Sim describes the simulated node (Kind "sim").
	Sim *SimDevice `json:"sim,omitempty"`
	// CUDALibrary is the driver library to load (Kind "cuda"; empty: libcuda.so.1).
	CUDALibrary string `json:"cuda_library,omitempty"`
}

// SimDevice is the simulated node an executor models; its physical memory is what the gpuserver lends.
type SimDevice struct {
	Node topology.Node `json:"node"`
	// Kernels is "reference" or "dry" (sim.ParseKernelMode).
	Kernels string `json:"kernels,omitempty"`
	// ProcessWide models what one process shares on a real GPU (sim.Options.ProcessWide).
	ProcessWide bool    `json:"process_wide,omitempty"`
	TimeScale   float64 `json:"time_scale,omitempty"`
	Granularity uint64  `json:"granularity,omitempty"`
}

// Started is the executor's answer to Start.
type Started struct {
	PID  int `json:"pid"`
	GPUs int `json:"gpus"`
}

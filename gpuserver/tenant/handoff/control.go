package handoff

import (
	"context"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// The control hand-off: what the gpuserver's pool and controller ask of the data plane (executor.DataPlane), asked
// of a tenant's executor process, with the same errors (Codes); and what the executor asks of the gpuserver (an
// implicit binding for calls outside a request) or tells it (a GPU failed, a kernel fault ends the executor, a copy
// it evicted on its own). ops.go pairs each kind with its request and answer bodies. KindExpire came with minor
// version 1, the images kinds (images.go) with 2, KindEvicted with 3.
const (
	// gpuserver -> executor, each answered.
	KindRegister   Kind = 30
	KindDeregister Kind = 31
	// KindEndInit is retired: the gpuserver never sends it (a request's KindAcquire ends the initialisation first);
	// its number is not reused.
	KindEndInit       Kind = 32
	KindAcquire       Kind = 33
	KindRelease       Kind = 34
	KindSwapIn        Kind = 35
	KindEvict         Kind = 36
	KindMarkUnhealthy Kind = 37
	KindStatus        Kind = 38
	KindWaitReady     Kind = 39 // waits until the function's copies on its active GPU completed
	KindExpire        Kind = 44 // answered once the function's work is fenced and its queued work ended

	// executor -> gpuserver.
	KindBindImplicit    Kind = 40 // answered
	KindReleaseImplicit Kind = 41 // answered
	KindGPUFailed       Kind = 42 // one-way
	KindFault           Kind = 43 // one-way; the executor exits after it
	KindEvicted         Kind = 47 // one-way
)

// Function is a registered function and its tenant.
type Function struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
}

// Name names a function.
type Name struct {
	Function string `json:"function"`
}

// Acquire holds a binding of Function on GPU (executor.Node.Acquire); Request says whether it is a request's (its
// sessions' calls then run on that GPU, and the function's initialisation ends first: executor.Node.EndInit) or an
// implicit one (initialisation).
type Acquire struct {
	Function string `json:"function"`
	GPU      int    `json:"gpu"`
	Source   int    `json:"source"`
	Binding  string `json:"binding"`
	Request  bool   `json:"request"`
}

// Release ends a binding.
type Release struct {
	Binding string `json:"binding"`
	// Abandoned says that the gpuserver gave the binding's hold up (its caller's context ended while the Acquire
	// was in flight; minor version 4): the executor drops the binding whatever became of its Acquire, which
	// completed (the binding is released), is in flight (it is cancelled and never binds: no call runs on it) or
	// has not started yet (it never will). Such a release is idempotent: it answers nothing broken, for a binding
	// never held too.
	Abandoned bool `json:"abandoned,omitempty"`
}

// Released answers Release: Broken is set when the binding broke while it was held (executor.Binding.Err).
type Released struct {
	Broken *Error `json:"broken,omitempty"`
}

// Expire ends a request's binding held longer than the maximum binding hold, as executor.Node.Expire does in one
// process: the binding breaks (its Release answers Broken with executor.ErrHoldExpired), the function's work in the
// executor is refused until that release, its session no longer runs calls on the binding's GPU, and the work it
// queued there gets GraceNS nanoseconds to finish before its tenant context on that GPU is torn down (the queued
// work dropped). Cause says why, for the logs and the errors.
type Expire struct {
	Binding string `json:"binding"`
	GraceNS int64  `json:"grace_ns"`
	Cause   string `json:"cause"`
}

// MaxExpireGrace bounds Expire.GraceNS: an executor never waits longer on the expired work before stopping it.
const MaxExpireGrace = time.Minute

// SwapIn swaps a function in (executor.Node.SwapIn).
type SwapIn struct {
	Function string `json:"function"`
	GPU      int    `json:"gpu"`
	Source   int    `json:"source"`
}

// Evict drops a function's copy on a GPU (executor.Node.Evict).
type Evict struct {
	Function string `json:"function"`
	GPU      int    `json:"gpu"`
}

// MarkUnhealthy takes a GPU out of service in the executor.
type MarkUnhealthy struct {
	GPU   int    `json:"gpu"`
	Cause string `json:"cause"`
}

// Status answers KindStatus: the executor's view of every GPU (its functions only), its image counters, its
// open sessions and the chunks it holds per GPU.
type Status struct {
	GPUs     []executor.Status   `json:"gpus"`
	Images   executor.ImageStats `json:"images"`
	Sessions int                 `json:"sessions"`
	Borrowed []int               `json:"borrowed"`
	// Records and Sleeps are the executor's remoting counters (remoting.Stats).
	Records int64 `json:"records"`
	Sleeps  int64 `json:"sleeps"`
	// Truncated is set when the functions lists were cut to fit a frame.
	Truncated bool `json:"truncated,omitempty"`
}

// Bound answers BindImplicit.
type Bound struct {
	GPU     int    `json:"gpu"`
	Binding string `json:"binding"`
}

// GPUFailed tells the gpuserver that a GPU failed under the executor (a device-level error). AfterFault says that
// a kernel of the tenant had faulted in the executor before: its contexts were poisoned, so the failure it saw may
// be its own, and the gpuserver checks the device itself once the executor ended instead of trusting the report.
type GPUFailed struct {
	GPU        int    `json:"gpu"`
	Error      string `json:"error"`
	AfterFault bool   `json:"after_fault,omitempty"`
}

// Evicted tells the gpuserver that the executor dropped Function's copy on GPU on its own (executor.Config.OnEvict:
// Reason executor.EvictPressure or executor.EvictReclaim), so that the controller, which placed on that memory,
// forgets the copy and counts the eviction.
type Evicted struct {
	GPU      int    `json:"gpu"`
	Function string `json:"function"`
	Reason   string `json:"reason"`
}

// Fault tells the gpuserver that a kernel of the tenant faulted: on a real GPU that poisons every context of the
// process, so the executor exits after this frame and the gpuserver restarts it.
type Fault struct {
	GPU      int    `json:"gpu"`
	Function string `json:"function"`
	Error    string `json:"error"`
}

// Codes are the sentinel errors that travel between the gpuserver and its executors, so that errors.Is gives the
// same answer on both sides (the API maps them to HTTP statuses, the remoting handler to CUDA results).
var Codes = []Code{
	{"executor.unknown_function", executor.ErrUnknownFunction},
	{"executor.not_captured", executor.ErrNotCaptured},
	{"executor.busy", executor.ErrBusy},
	{"executor.pinned", executor.ErrPinned},
	{"executor.unhealthy", executor.ErrUnhealthy},
	{"executor.no_memory", executor.ErrNoMemory},
	{"executor.invalid", executor.ErrInvalid},
	{"executor.broken", executor.ErrBroken},
	{"executor.context_fault", executor.ErrContextFault},
	{"executor.lost", executor.ErrLost}, // pool.ErrFunctionLost: both names decode to it
	{"executor.hold_expired", executor.ErrHoldExpired},
	{"executor.read_only", executor.ErrReadOnly},
	{"memory.no_space", memory.ErrNoSpace},
	{"memory.invalid", memory.ErrInvalid},
	{"repository.not_found", repository.ErrNotFound},
	{"repository.invalid", repository.ErrInvalid},
	{"repository.budget", repository.ErrBudget},
	{"device.invalid_value", device.ErrInvalidValue},
	{"device.out_of_memory", device.ErrOutOfMemory},
	{"device.illegal_address", device.ErrIllegalAddress},
	{"device.kernel_fault", device.ErrKernelFault},
	{"device.unavailable", device.ErrUnavailable},
	{"device.not_found", device.ErrNotFound},
	{"device.not_supported", device.ErrNotSupported},
	{"device.invalid_image", device.ErrInvalidImage},
	{"device.not_ready", device.ErrNotReady},
	{"device.no_binary_for_gpu", device.ErrNoBinaryForGPU},
	{"pool.unknown_function", pool.ErrUnknownFunction},
	{"pool.unknown_binding", pool.ErrUnknownBinding},
	{"pool.gpu_unhealthy", pool.ErrGPUUnhealthy},
	{"pool.binding_broken", pool.ErrBindingBroken},
	{"pool.no_healthy_gpu", pool.ErrNoHealthyGPU},
	{"pool.limit", pool.ErrLimit},
	{"pool.overloaded", pool.ErrOverloaded},
	{"pool.backed_off", pool.ErrBackedOff},
	{"pool.function_lost", pool.ErrFunctionLost},
	{"pool.too_large", pool.ErrTooLarge},
	{"pool.invalid_spec", pool.ErrInvalidSpec},
	{"context.canceled", context.Canceled},
	{"context.deadline_exceeded", context.DeadlineExceeded},
	{"handoff.protocol", ErrProtocol},
	{"handoff.closed", ErrClosed},
}

// Package pool defines what a node's GPU pool offers to the gpuserver's API: functions register their GPU
// requirements, and each request acquires a binding to one GPU and releases it when done. The FCFS type is the
// simplest pool; the controller package provides the SLO-aware one behind the same interface.
package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
)

// Isolation, scratch and model modes of a function: the values of its annotations (package contract).
const (
	IsolationShared   = contract.IsolationShared
	IsolationIsolated = contract.IsolationIsolated
	ScratchResident   = contract.ScratchResident
	ScratchRequest    = contract.ScratchRequest
	ModelPrivate      = contract.ModelPrivate
	ModelShared       = contract.ModelShared
)

// FunctionSpec is what a GPU function requires of the pool. It travels as JSON on the gpuserver API.
type FunctionSpec struct {
	// Name of the function (unique on the node).
	Name string `json:"name"`
	// MemoryBytes is the function's GPU memory quota; its resident footprint never exceeds it.
	MemoryBytes uint64 `json:"memory_bytes"`
	// SLO is the latency deadline of one request; 0 means none.
	SLO time.Duration `json:"slo_ns,omitempty"`
	// Percentile of requests that must meet the SLO, in (0, 100).
	Percentile float64 `json:"percentile,omitempty"`
	// Isolation is IsolationShared or IsolationIsolated (a GPU of its own while bound).
	Isolation string `json:"isolation,omitempty"`
	// Scratch is ScratchResident (the default, also ""): memory the function allocates after its
	// initialisation is its own, kept with its copy and across evictions and moves (written back to host memory,
	// restored at the next swap-in); or ScratchRequest: it is its requests' (a KV cache), given back when the
	// function's last request in flight ends and mapped again, zeroed, for the next, never copied.
	Scratch string `json:"scratch,omitempty"`
	// Model is ModelPrivate (the default, also ""): the function's model memory is its own on a GPU; or
	// ModelShared: the function never writes its model memory after its initialisation, so chunks of it identical
	// to another such function's of its tenant are mapped once, read-only, on a GPU where both are resident.
	Model string `json:"model,omitempty"`
	// ComputeRequest and ComputeLimit are the function's compute shares of a GPU (share.go), as named by its
	// annotations; 0 when not named (both unnamed: exclusive).
	ComputeRequest float64 `json:"compute_request,omitempty"`
	ComputeLimit   float64 `json:"compute_limit,omitempty"`
}

// Binding is one request's hold on a GPU, from Acquire to Release.
type Binding struct {
	// ID names the binding in Release.
	ID string `json:"id"`
	// Function the binding belongs to.
	Function string `json:"function"`
	// Instance of the function the binding holds ("" for the function itself: InstanceKey).
	Instance string `json:"instance,omitempty"`
	// GPU is the index of the bound GPU in the node's pool.
	GPU int `json:"gpu"`
	// GPUName is the device's model name, e.g. "Tesla V100-SXM2-32GB (simulated)".
	GPUName string `json:"gpu_name"`
	// Swap says how the model reached the GPU for this request: "none" (resident), "nvlink", "pcie".
	Swap string `json:"swap,omitempty"`
	// Queued is how long the request waited before it was bound.
	Queued time.Duration `json:"queued_ns"`
}

// GPUStatus describes one GPU of the pool.
type GPUStatus struct {
	Index       int      `json:"index"`
	Name        string   `json:"name"`
	MemoryBytes uint64   `json:"memory_bytes"`
	UsedBytes   uint64   `json:"used_bytes"`
	Busy        bool     `json:"busy"`
	Healthy     bool     `json:"healthy"`
	Resident    []string `json:"resident"`
	// CoRunners lists the bindings held on the GPU now when they hold compute shares (share.go), the first binding
	// first; empty while the GPU is idle or held by an exclusive binding.
	CoRunners []CoRunner `json:"corunners,omitempty"`
}

// FunctionStatus describes one registered function.
type FunctionStatus struct {
	FunctionSpec
	Queued   int   `json:"queued"`
	Running  int   `json:"running"`
	Resident []int `json:"resident_gpus"`
	Served   int64 `json:"served"`
	OnTime   int64 `json:"on_time"`
	// Refused counts the requests the overload control refused (429 with Retry-After).
	Refused int64 `json:"refused,omitempty"`
	// Shed: the overload control sheds the function now (its requests wait behind the others').
	Shed bool `json:"shed,omitempty"`
	// Faults counts the function's kernel faults on the node (each ended its tenant's executor, never a GPU).
	Faults int64 `json:"faults,omitempty"`
	// BackedOff is how much longer the function is backed off after repeated kernel faults (its requests are
	// answered 503 with Retry-After meanwhile); 0 when it is not.
	BackedOff time.Duration `json:"backed_off_ns,omitempty"`
	// Instances counts the function's instances the pool knows (InstanceKey); their requests, copies and counts
	// are the function's (Resident lists every GPU holding a copy of one of them).
	Instances int `json:"instances,omitempty"`
}

// SLOSummary is a node's two figures: functions within their SLO and requests served within it, with the
// requests refused beside them.
type SLOSummary struct {
	// Functions counts the functions with requests (served or refused), FunctionsMet those of them with at least
	// their percentile of requests on time.
	Functions    int `json:"functions"`
	FunctionsMet int `json:"functions_met"`
	// Requests counts the requests served or refused, OnTime those served within the SLO, Refused those refused.
	Requests int64 `json:"requests"`
	OnTime   int64 `json:"on_time"`
	Refused  int64 `json:"refused"`
}

// OverloadView is the overload control's state in a pool's status.
type OverloadView struct {
	// Setting is "auto", "off" or the target share of GPU time.
	Setting string `json:"setting"`
	// Demand is the functions' estimated demand in GPUs at the last decision, Capacity the healthy GPUs.
	Demand   float64 `json:"demand_gpus"`
	Capacity float64 `json:"capacity_gpus"`
	// Shedding lists the functions shed now.
	Shedding []string `json:"shedding"`
	// Refused counts the requests the control refused.
	Refused int64 `json:"refused"`
}

// Status is a snapshot of the pool.
type Status struct {
	Policy    string           `json:"policy"`
	GPUs      []GPUStatus      `json:"gpus"`
	Functions []FunctionStatus `json:"functions"`
	Queued    int              `json:"queued"`
	// Swaps counts bindings by how the model reached the GPU: "none" (resident), "nvlink", "pcie".
	Swaps map[string]int64 `json:"swaps,omitempty"`
	// SimKernels is what the simulated GPUs do with kernels they cannot compute: "reference" (refuse them) or
	// "dry" (accept them without executing them: the --sim-kernels=dry protocol-test mode, whose results are
	// wrong); empty for real GPUs.
	SimKernels string `json:"sim_kernels,omitempty"`
	// SimDryLaunches counts the kernel launches accepted and not executed in dry mode.
	SimDryLaunches uint64 `json:"sim_dry_launches,omitempty"`
	// Tenants describes the tenants' executor processes (docs/tenants.md); empty when every tenant runs in the
	// gpuserver's process.
	Tenants []TenantStatus `json:"tenants,omitempty"`
	// SLO is the node's two figures since it started; nil for a pool that keeps none.
	SLO *SLOSummary `json:"slo,omitempty"`
	// Overload is the overload control's state; nil for a pool without one.
	Overload *OverloadView `json:"overload,omitempty"`
	// Evictions counts the copies dropped from GPUs: by the controller's decisions, and by the data plane on its own
	// (reported to the controller); nil for a pool that keeps no count.
	Evictions *EvictionCounts `json:"evictions,omitempty"`
}

// EvictionCounts are the copies dropped from GPUs since the pool started.
type EvictionCounts struct {
	// Controller counts the evictions the controller decided (to make room for a placement).
	Controller int64 `json:"controller"`
	// DataPlane counts, by reason ("pressure": a swap-in ran out of chunks; "reclaim": another tenant needed them
	// back), the copies the data plane dropped on its own and reported.
	DataPlane map[string]int64 `json:"data_plane"`
}

// TenantStatus describes one tenant's executor process.
type TenantStatus struct {
	// Tenant is "namespace/<ns>" or "function/<name>" (FunctionSpec.Tenant).
	Tenant string `json:"tenant"`
	// State is "starting", "up", "backoff" (it ended and waits to be restarted) or "stopped".
	State string `json:"state"`
	// Generation counts the executors started for the tenant; PID is the running one's.
	Generation int `json:"generation"`
	PID        int `json:"pid,omitempty"`
	// Restarts counts the executors that ended and were restarted, Faults those ended by a kernel fault of the
	// tenant; LastExit says how the last one ended.
	Restarts  int    `json:"restarts"`
	Faults    int    `json:"faults"`
	LastExit  string `json:"last_exit,omitempty"`
	Functions int    `json:"functions"`
}

// Summarize computes the two figures from the functions' counts.
func Summarize(fns []FunctionStatus) SLOSummary {
	var s SLOSummary
	for _, f := range fns {
		n := f.Served + f.Refused
		if n == 0 {
			continue
		}
		s.Functions++
		p := f.Percentile
		if p == 0 {
			p = contract.DefaultPercentile
		}
		if float64(f.OnTime) >= p/100*float64(n)-1e-9 {
			s.FunctionsMet++
		}
		s.Requests += n
		s.OnTime += f.OnTime
		s.Refused += f.Refused
	}
	return s
}

// Pool is a node's set of GPUs shared by late-bound functions.
type Pool interface {
	// Register adds or replaces a function's requirements.
	Register(ctx context.Context, spec FunctionSpec) error
	// Deregister removes a function; it fails with ErrUnknownFunction for a name never registered.
	Deregister(ctx context.Context, name string) error
	// Acquire waits until the function is bound to a GPU, ctx ends (ctx.Err() wrapped), or the request can never
	// be served (ErrTooLarge).
	Acquire(ctx context.Context, function string) (Binding, error)
	// Release ends a binding; it fails with ErrUnknownBinding for an unknown or released ID.
	Release(ctx context.Context, bindingID string) error
	// Status returns a snapshot of GPUs, functions and queues.
	Status(ctx context.Context) Status
}

// initialisationKey marks an Acquire's context as a function's initialisation (WithInitialisation).
type initialisationKey struct{}

// WithInitialisation marks ctx's Acquire as a function's initialisation (its CUDA calls outside any request: the
// import of its handler, its model's load), not a request: the pool binds it like one, but it counts in no
// function's requests served or on time and teaches its predictors nothing.
func WithInitialisation(ctx context.Context) context.Context {
	return context.WithValue(ctx, initialisationKey{}, true)
}

// IsInitialisation reports whether ctx was marked by WithInitialisation.
func IsInitialisation(ctx context.Context) bool {
	v, _ := ctx.Value(initialisationKey{}).(bool)
	return v
}

// unservedKey marks a Release's context as the end of a binding that served nothing (WithUnserved).
type unservedKey struct{}

// WithUnserved marks ctx's Release as the end of a binding whose acquire failed after the pool bound it (the data
// plane's hold on its GPU failed or its caller gave up): no request ran on it, so the pool counts it in no
// function's requests served or on time and teaches its predictors nothing.
func WithUnserved(ctx context.Context) context.Context {
	return context.WithValue(ctx, unservedKey{}, true)
}

// IsUnserved reports whether ctx was marked by WithUnserved.
func IsUnserved(ctx context.Context) bool {
	v, _ := ctx.Value(unservedKey{}).(bool)
	return v
}

// Sentinel errors of a pool; the gpuserver API maps them to HTTP statuses.
var (
	ErrUnknownFunction = errors.New("unknown function")
	ErrUnknownBinding  = errors.New("unknown binding")
	ErrInvalidSpec     = errors.New("invalid function spec")
	// ErrTooLarge: the function's memory does not fit on any GPU of the node.
	ErrTooLarge = errors.New("function does not fit on any GPU")
	// ErrGPUUnhealthy: the GPU of a binding failed while it was held; the request's work is lost, later requests
	// run on healthy GPUs.
	ErrGPUUnhealthy = errors.New("GPU unhealthy")
	// ErrBindingBroken: the device state a binding served was replaced while it was held (the function's
	// processes all ended and its memory was reset, or a kernel fault restored its memory from the host image);
	// the request's work must not be trusted.
	ErrBindingBroken = errors.New("binding broke")
	// ErrFunctionLost: device state of the function that no image holds (its memory before its initialisation
	// ended, module globals it wrote, scratch it keeps between requests) was destroyed by a kernel fault in its
	// context or a GPU failure, or cannot be kept (scratch beyond its quota): its process
	// must start again and initialise afresh. The API answers 503 with "restart": true, and the gpu-python
	// template exits so that its supervisor starts it again.
	ErrFunctionLost = errors.New("function's device state was lost: its process must start again")
	// ErrNoHealthyGPU: no GPU of the node is in service; a request fails at once instead of waiting for one.
	ErrNoHealthyGPU = errors.New("no healthy GPU on this node")
	// ErrLimit: the pool holds as many functions as it may (a bound against unbounded registrations).
	ErrLimit = errors.New("function limit reached")
	// ErrOverloaded: the node is overloaded and sheds the function's requests for now (the API answers 429 with
	// Retry-After); the caller may retry later or on another node. An *OverloadedError carries the details.
	ErrOverloaded = errors.New("node overloaded")
)

// ErrBackedOff: the function's kernels faulted again and again on this node, and its requests are refused for a
// while (the API answers 503 with Retry-After); a *BackedOffError carries the details.
var ErrBackedOff = errors.New("function backed off after repeated kernel faults")

// BackedOffError is a request refused because its function is backed off after repeated kernel faults; it wraps
// ErrBackedOff.
type BackedOffError struct {
	Function string
	// RetryAfter is when the backoff ends.
	RetryAfter time.Duration
	// Faults counts the function's kernel faults on the node.
	Faults int64
}

func (e *BackedOffError) Error() string {
	return fmt.Sprintf("%v: %q refused, retry after %v (%d kernel faults on this node)", ErrBackedOff, e.Function,
		e.RetryAfter, e.Faults)
}

// Unwrap makes errors.Is(err, ErrBackedOff) hold.
func (e *BackedOffError) Unwrap() error { return ErrBackedOff }

// OverloadedError is a request refused because the node sheds its function; it wraps ErrOverloaded.
type OverloadedError struct {
	Function string
	// RetryAfter is when the node decides again which functions it sheds.
	RetryAfter time.Duration
	// Episode numbers the function's shedding episodes on the node (from 1), so that a refusal can be logged once
	// per episode; 0 when unknown.
	Episode uint64
	// Reason says why, for the caller.
	Reason string
}

func (e *OverloadedError) Error() string {
	return fmt.Sprintf("%v: %q refused, retry after %v: %s", ErrOverloaded, e.Function, e.RetryAfter, e.Reason)
}

// Unwrap makes errors.Is(err, ErrOverloaded) hold.
func (e *OverloadedError) Unwrap() error { return ErrOverloaded }

// MaxNameLength is the longest function name a pool accepts: the remoting hello carries it in 128 bytes with its
// terminating NUL. An OpenFaaS name "service.namespace" of two DNS labels fits.
const MaxNameLength = 127

// CheckName reports why name cannot name a function: empty, longer than MaxNameLength, or made of anything but
// ASCII letters, digits, '-', '_' and '.' (starting with a letter or digit). Names end up in URLs, log lines,
// metric labels and file names; a bounded alphabet keeps each of them safe.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name is empty", ErrInvalidSpec)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%w: name is %d bytes long, at most %d", ErrInvalidSpec, len(name), MaxNameLength)
	}
	for i, c := range []byte(name) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_' && c != '.') {
			return fmt.Errorf("%w: name %q: byte %d (%q) is not allowed (letters, digits, '-', '_', '.'; "+
				"a letter or digit first)", ErrInvalidSpec, name, i, c)
		}
	}
	return nil
}

// Namespace is the OpenFaaS namespace of a function name: what follows its first '.' (the provider registers
// "service.namespace", and service names are DNS labels without dots), or "" for a name without one (the
// provider's default namespace). An instance key's namespace is its function's.
func Namespace(function string) string {
	function, _ = SplitInstance(function)
	if _, ns, ok := strings.Cut(function, "."); ok {
		return ns
	}
	return ""
}

// Tenant is the isolation domain of a function on a GPU: functions of one namespace share a GPU
// address space, functions of different namespaces never do, and an isolated function shares with none.
func (s FunctionSpec) Tenant() string {
	if s.Isolation == IsolationIsolated {
		fn, _ := SplitInstance(s.Name) // an instance is in its function's tenant
		return "function/" + fn
	}
	return "namespace/" + Namespace(s.Name)
}

// Validate checks a spec and fills defaults (percentile 98, isolation shared). Its name is a function's or an
// instance's (CheckKey).
func (s *FunctionSpec) Validate() error {
	if err := CheckKey(s.Name); err != nil {
		return err
	}
	switch {
	case s.MemoryBytes == 0:
		return fmt.Errorf("%w: memory_bytes must be > 0", ErrInvalidSpec)
	case s.SLO < 0:
		return fmt.Errorf("%w: slo must be >= 0", ErrInvalidSpec)
	case s.Percentile < 0 || s.Percentile >= 100:
		return fmt.Errorf("%w: percentile must be in (0, 100)", ErrInvalidSpec)
	}
	if s.Percentile == 0 {
		s.Percentile = contract.DefaultPercentile
	}
	switch s.Isolation {
	case "":
		s.Isolation = IsolationShared
	case IsolationShared, IsolationIsolated:
	default:
		return fmt.Errorf("%w: isolation must be shared or isolated", ErrInvalidSpec)
	}
	switch s.Scratch {
	case "", ScratchResident, ScratchRequest:
	default:
		return fmt.Errorf("%w: scratch must be resident or request", ErrInvalidSpec)
	}
	switch s.Model {
	case "", ModelPrivate, ModelShared:
	default:
		return fmt.Errorf("%w: model must be private or shared", ErrInvalidSpec)
	}
	return s.validateShares()
}

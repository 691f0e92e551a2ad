package remoting

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// deviceHandler executes one session's calls on the node's executors (package executor). It is used by the
// session's goroutine only.
//
// Memory: every block comes from the executor node (Node.AllocSegment): model blocks before the function's
// initialisation ends, scratch after; the node backs them on the GPU the function is active on, at addresses that
// are the same on every GPU. Copies, memsets, launches and event records go through the function's executor
// stream (Node.Stream), which waits per segment for a swap still landing. When the binding names another GPU the
// node swaps the function there (from a GPU holding a copy, else from the host image); the handler moves nothing
// itself except module globals, which live at a different address on each GPU (see global).
// All of the session's CUDA streams run in order on the function's one stream of the bound GPU.
//
// Its calls are in files by concern: bind.go (the bound GPU, moving there), memory.go (blocks, pointer
// attributes), copies.go (copies and memsets; copy2d.go for the 2D and 3D ones), modules.go (modules, kernels,
// module globals), launch.go, streams.go, events.go, vmm.go (reserved ranges and mappings), graph.go (stream
// capture and graphs).
type deviceHandler struct {
	UnimplementedHandler
	cfg  Config
	info SessionInfo
	log  *slog.Logger
	node *executor.Node

	gpu      int // bound GPU whose stream is open; -1 before the first GPU call
	stream   device.Stream
	release  func()    // releases the implicit binding, when held
	implicit int       // GPU of the implicit binding
	boundAt  time.Time // when the implicit binding was taken
	explicit bool      // a request has bound the function: its initialisation has ended
	// declared: the process said its initialisation began (ProcessPhase 1), initialised: and that it ended
	// (lifecycle.go); while declared and not initialised, requests of other processes do not end it
	declared, initialised bool
	// lost is what a wait for the session's work answered where no call could pass the answer on (the implicit
	// binding's idle release, the switch to a request's binding, the end of a long implicit hold): the next call
	// that binds or waits for work answers it, once, instead of success (bind.go).
	lost Result
	used uint64 // bytes the session charged to the function's quota (functionBudgets: all its sessions together)

	allocs  []allocation // sorted by ptr
	handles uint64
	modules map[uint64]*module
	funcs   map[uint64]*function
	streams map[uint64]bool
	events  map[uint64]*event
	globals []*global

	images       *moduleImages    // the node's module images (Config.images)
	pendingImage []byte           // chunks of a module image whose load call has not come yet (reserved in images)
	imageRefused bool             // a chunk of the image being received was refused: so are the rest and its load
	budgets      *functionBudgets // what the function's sessions hold together (Config.budgets)

	g graphs // stream captures and graphs (graph.go)

	vmmRanges   map[uint64]uint64 // reservations: start -> size
	vmmHandles  map[uint64]*vmmHandle
	vmmMappings map[uint64]*vmmMapping // by address
}

func newDeviceHandler(ctx context.Context, cfg Config, info SessionInfo, log *slog.Logger) (*deviceHandler, error) {
	if err := cfg.Node.Register(info.Function); err != nil {
		return nil, err
	}
	if err := cfg.Node.SetTenant(ctx, info.Function, info.Spec.Tenant()); err != nil { // its namespace, or itself
		return nil, err
	}
	if err := cfg.Node.SetScratchPerRequest(info.Function, info.Spec.Scratch == pool.ScratchRequest); err != nil {
		return nil, err
	}
	if err := cfg.Node.SetScratchLimit(info.Function, info.Spec.MemoryBytes); err != nil { // its host copies' bound
		return nil, err
	}
	if err := cfg.Node.SetModelShared(info.Function, info.Spec.Model == pool.ModelShared); err != nil {
		return nil, err
	}
	images := cfg.images
	if images == nil { // a handler built without a server (tests)
		images = newModuleImages(DefaultMaxModuleBytesPerFunction, DefaultMaxModuleBytes)
	}
	budgets := cfg.budgets
	if budgets == nil { // a handler built without a server (tests)
		budgets = newFunctionBudgets(DefaultMaxGraphBytesPerFunction)
	}
	h := &deviceHandler{
		cfg: cfg, info: info, log: log, node: cfg.Node, images: images, budgets: budgets,
		gpu:     -1,
		handles: 0x1000,
		modules: map[uint64]*module{},
		funcs:   map[uint64]*function{},
		streams: map[uint64]bool{},
		events:  map[uint64]*event{},
	}
	h.g.init()
	return h, nil
}

func (h *deviceHandler) handle() uint64 {
	h.handles += 0x10
	return h.handles
}

// result maps a device error to a CUDA result.
func result(err error) Result {
	switch {
	case err == nil:
		return ResultSuccess
	case errors.Is(err, executor.ErrUnhealthy):
		return ResultDeviceUnavailable
	case errors.Is(err, executor.ErrBroken):
		return ResultContextIsDestroyed
	case errors.Is(err, device.ErrKernelFault):
		return ResultLaunchFailed
	case errors.Is(err, device.ErrIllegalAddress):
		return ResultIllegalAddress
	case errors.Is(err, executor.ErrReadOnly):
		return ResultNotPermitted
	case errors.Is(err, device.ErrInvalidValue), errors.Is(err, memory.ErrInvalid), errors.Is(err, executor.ErrInvalid):
		return ResultInvalidValue
	case errors.Is(err, device.ErrOutOfMemory), errors.Is(err, memory.ErrNoSpace), errors.Is(err, executor.ErrNoMemory):
		return ResultOutOfMemory
	case errors.Is(err, device.ErrNotFound):
		return ResultNotFound
	case errors.Is(err, device.ErrKernelNotSimulated):
		return ResultKernelNotSimulated
	case errors.Is(err, device.ErrNotSupported):
		return ResultNotSupported
	case errors.Is(err, device.ErrInvalidImage):
		return ResultInvalidImage
	case errors.Is(err, device.ErrNotReady):
		return ResultNotReady
	case errors.Is(err, device.ErrNoBinaryForGPU):
		return ResultNoBinaryForGPU
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ResultSystemNotReady
	}
	return ResultUnknown
}

// Close returns the session's memory and objects to the node.
func (h *deviceHandler) Close() error {
	ctx := context.Background()
	var errs []error
	if h.stream != nil {
		errs = append(errs, h.stream.Synchronize(ctx))
	}
	for _, e := range h.events {
		errs = append(errs, e.ev.Destroy())
	}
	for _, m := range h.modules {
		errs = append(errs, h.unload(m))
		h.images.release(h.info.Function, m.ref)
	}
	h.images.unreserve(h.info.Function, uint64(len(h.pendingImage)))
	h.pendingImage = nil
	h.unchargeGraph(h.g.charged)
	h.unchargeDevice(h.used)
	for _, a := range h.allocs {
		if a.global == nil {
			errs = append(errs, h.node.Free(h.info.Function, device.Ptr(a.ptr)))
		}
	}
	if h.release != nil {
		h.release()
	}
	h.endInit() // a process that ended in its initialisation holds the function's capture back no more
	return errors.Join(errs...)
}

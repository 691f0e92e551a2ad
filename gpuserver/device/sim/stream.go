package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// op is one piece of queued work; run does it and returns its modelled duration.
type op struct {
	run     func() (time.Duration, error)
	compute bool            // a kernel, memset or local copy: it occupies its GPU's compute engine
	record  *eventGen       // mark this event generation done
	wait    *eventGen       // wait for this event generation
	sync    chan syncResult // Synchronize marker
	kind    string          // for error messages
	enq     time.Time       // when it was enqueued: it starts at the later of this and the previous op's end
}

// syncResult is what a Synchronize marker reports: the stream's first error and when its work completes
// (modelled).
type syncResult struct {
	err error
	at  time.Time
}

// stream runs its ops in order on a goroutine of its own (owned by the stream; stopped by Destroy or Close).
type stream struct {
	b    *Backend
	gpu  int
	ctx  *simContext // nil: the backend's own context of the GPU
	who  int         // who its work is, for memory access (see who)
	q    chan op
	done chan struct{}

	mu         sync.Mutex
	destroyed  bool
	stopOnce   sync.Once
	aborted    atomic.Bool // its context was destroyed: work still queued is dropped, not run
	capture    *[]op       // while capturing (graph.go): the operations recorded instead of queued
	captureErr error       // what the capture could not hold

	// owned by the worker goroutine
	err      error
	timeline time.Time // modelled end of the previous op
	opStart  time.Time // modelled start of the running op

	meter meter // its compute work (meter.go)
}

// NewStream creates a stream on a GPU (in the backend's own context of the GPU).
func (b *Backend) NewStream(gpu int) (device.Stream, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	s, err := b.newStream(gpu, nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (b *Backend) newStream(gpu int, ctx *simContext) (*stream, error) {
	s := &stream{b: b, gpu: gpu, ctx: ctx, who: who(gpu, 0), q: make(chan op, 4096), done: make(chan struct{})}
	if ctx != nil {
		s.who = who(gpu, ctx.id)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	b.streams[s] = struct{}{}
	b.workers.Add(1)
	b.mu.Unlock()
	go s.work()
	return s, nil
}

func (s *stream) GPU() int { return s.gpu }

func (s *stream) work() {
	defer s.b.workers.Done()
	defer close(s.done)
	for o := range s.q {
		if s.err == nil {
			s.err = s.ctxErr() // a fault of another stream of the context (or of the process) poisons this one too
		}
		switch {
		case o.sync != nil:
			o.sync <- syncResult{err: s.err, at: s.completion(o.enq)}
			if s.ctxErr() == nil { // a context fault stays
				s.err = nil
			}
		case o.record != nil:
			o.record.at = s.completion(o.enq)
			o.record.finish(s.err)
		case o.wait != nil:
			select {
			case <-o.wait.done:
				if o.wait.at.After(s.timeline) { // the work after the wait starts when the event completes
					s.timeline = o.wait.at
				}
			case <-s.b.ctx.Done():
			}
		case s.err != nil:
			// an earlier error poisons the stream until it is reported
		case s.aborted.Load():
			s.err = fmt.Errorf("sim: gpu %d: %s: %w: its context was destroyed", s.gpu, o.kind, device.ErrUnavailable)
		default:
			start := o.enq
			if s.timeline.After(start) {
				start = s.timeline
			}
			s.opStart = start
			if err := s.b.failure(s.gpu); err != nil {
				s.err = fmt.Errorf("sim: gpu %d: %s: %w", s.gpu, o.kind, err)
				continue
			}
			d, err := runOp(o)
			s.meter.add(o, d, s.b.opts.TimeScale)
			if err != nil {
				s.err = fmt.Errorf("sim: gpu %d: %s: %w", s.gpu, o.kind, err)
				if device.IsContextFault(err) {
					if s.ctx != nil {
						s.ctx.poison(s.err)
					}
					s.b.poisonProcess(s.err)
				}
				continue
			}
			if !s.b.timed() || d <= 0 {
				continue
			}
			d = time.Duration(float64(d) * s.b.opts.TimeScale)
			if o.compute {
				// Kernels, memsets and local copies queue on the GPU's compute engine behind those of its other
				// streams, and take no wall-clock time here: what waits for them (Synchronize, an event) waits
				// until the modelled time.
				start = s.b.engines[s.gpu].reserve(start, d)
				s.timeline = start.Add(d)
				continue
			}
			s.timeline = start.Add(d)
			if err := s.b.clock.SleepUntil(s.b.ctx, s.timeline); err != nil {
				s.err = fmt.Errorf("sim: gpu %d: %w: backend closed", s.gpu, device.ErrUnavailable)
			}
		}
	}
}

// completion is when the work enqueued before a marker enqueued at enq completes, in modelled time: the stream's
// timeline, or enq when the stream was idle by then. It is not when the stream's goroutine reached the marker:
// that is later when the host computing a reference kernel (or the machine running the sim) was slower than the
// modelled kernel, and counting it made the events' times, and what waits for them, depend on the machine's load
// (TestTimedEventTimeIsModelledWhenTheStreamIsLate).
func (s *stream) completion(enq time.Time) time.Time {
	at := enq
	if s.timeline.After(at) {
		at = s.timeline
	}
	return at
}

// runOp runs one op; a panic of a reference kernel (a bug reached by some input) is a kernel fault of the
// stream's context, as a crashing kernel is on a GPU, never a crash of the process.
func runOp(o op) (d time.Duration, err error) {
	defer func() {
		if r := recover(); r != nil {
			d, err = 0, fmt.Errorf("%w: %s panicked: %v", device.ErrKernelFault, o.kind, r)
		}
	}()
	return o.run()
}

func (s *stream) isDestroyed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.destroyed
}

func (s *stream) enqueue(o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("%w: stream destroyed", device.ErrInvalidValue)
	}
	if o.sync == nil {
		if err := s.ctxErr(); err != nil { // after a context fault every call of the context fails with it
			return err
		}
	}
	if s.capture != nil {
		if o.run == nil || o.kind == "copy host to device" || o.kind == "copy device to host" {
			err := fmt.Errorf("%w: a stream capture holds device work only", device.ErrNotSupported)
			if s.captureErr == nil {
				s.captureErr = err
			}
			return err
		}
		*s.capture = append(*s.capture, o)
		return nil
	}
	o.enq = s.b.clock.Now()
	select {
	case s.q <- o:
		return nil
	case <-s.b.ctx.Done():
		return fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
}

func (s *stream) stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.destroyed = true
		close(s.q)
		s.mu.Unlock()
	})
}

// transfer runs fn as a transfer on path p of bytes and returns its modelled duration.
func (s *stream) transfer(p topology.Path, bytes uint64, fn func() error) (time.Duration, error) {
	start := s.opStart
	t, d := s.b.startTransfer(p, bytes)
	defer s.b.endTransfer(t)
	if err := fn(); err != nil {
		return 0, err
	}
	if s.b.opts.TimeScale > 0 {
		// hold the link for the modelled time so that concurrent transfers see it; the stream's timeline
		// absorbs timer slop, so back-to-back copies add up to their modelled time
		s.timeline = start.Add(time.Duration(float64(d) * s.b.opts.TimeScale))
		if err := s.b.clock.SleepUntil(s.b.ctx, s.timeline); err != nil {
			return 0, err
		}
		return 0, nil
	}
	return d, nil
}

func (s *stream) CopyHtoD(dst device.Ptr, src []byte) error {
	n := uint64(len(src))
	return s.enqueue(op{kind: "copy host to device", run: func() (time.Duration, error) {
		return s.transfer(topology.HostPath(s.gpu), n, func() error { return s.b.writeDevice(s.who, dst, src) })
	}})
}

func (s *stream) CopyDtoH(dst []byte, src device.Ptr) error {
	n := uint64(len(dst))
	return s.enqueue(op{kind: "copy device to host", run: func() (time.Duration, error) {
		return s.transfer(topology.HostPath(s.gpu), n, func() error { return s.b.readDevice(s.who, dst, src) })
	}})
}

func (s *stream) CopyDtoD(dst, src device.Ptr, size uint64) error {
	return s.enqueue(op{kind: "copy device to device", compute: true, run: func() (time.Duration, error) {
		move := func() error { return s.b.copyDevice(s.who, dst, src, size) }
		from, to := s.b.ownerGPU(src), s.b.ownerGPU(dst)
		if from >= 0 && to >= 0 && from != to {
			return s.transfer(topology.PeerPath(from, to), size, move)
		}
		if err := move(); err != nil {
			return 0, err
		}
		return s.b.memTime(2 * size), nil
	}})
}

func (s *stream) Memset8(dst device.Ptr, v uint8, n uint64) error {
	return s.enqueue(op{kind: "memset", compute: true, run: func() (time.Duration, error) {
		if v == 0 {
			return s.b.memTime(n), s.b.zeroDevice(s.who, dst, n)
		}
		segs, err := s.b.resolve(s.who, dst, n)
		if err == nil {
			err = s.b.writable(s.who, dst, n)
		}
		if err != nil {
			return 0, err
		}
		for _, sg := range segs {
			for i := range sg.buf {
				sg.buf[i] = v
			}
		}
		return s.b.memTime(n), nil
	}})
}

func (s *stream) Memset32(dst device.Ptr, v uint32, n uint64) error {
	if uint64(dst)%4 != 0 {
		return fmt.Errorf("%w: memset32 at %#x is not 4-byte aligned", device.ErrInvalidValue, uint64(dst))
	}
	return s.enqueue(op{kind: "memset", compute: true, run: func() (time.Duration, error) {
		buf := make([]byte, 4*n)
		for i := uint64(0); i < n; i++ {
			binary.LittleEndian.PutUint32(buf[4*i:], v)
		}
		if err := s.b.writeDevice(s.who, dst, buf); err != nil {
			return 0, err
		}
		return s.b.memTime(4 * n), nil
	}})
}

func (s *stream) Launch(f device.Function, grid, block device.Dim3, sharedMem uint32, args []byte) error {
	s.b.spinLaunchCPU()
	fn, ok := f.(*function)
	if !ok || fn.mod.b != s.b {
		return fmt.Errorf("%w: function of another backend", device.ErrInvalidValue)
	}
	if fn.mod.gpu != s.gpu {
		return fmt.Errorf("%w: kernel %s is loaded on gpu %d, stream is on gpu %d", device.ErrInvalidValue, fn.name,
			fn.mod.gpu, s.gpu)
	}
	if fn.mod.isUnloaded() {
		return fmt.Errorf("%w: module unloaded", device.ErrInvalidValue)
	}
	if fn.mod.ctx != s.ctx {
		return fmt.Errorf("%w: kernel %s belongs to another context than the stream", device.ErrInvalidValue, fn.name)
	}
	if uint32(len(args)) < device.ArgsSize(fn.params) {
		return fmt.Errorf("%w: kernel %s needs %d argument bytes, got %d", device.ErrInvalidValue, fn.name,
			device.ArgsSize(fn.params), len(args))
	}
	if fn.kernel == nil {
		if s.b.opts.Kernels != KernelsDry {
			return s.b.notComputed(fn)
		}
		s.b.dryLaunches.Add(1)
		d := s.b.kernelTime(fn.name, s.b.opts.Profile.Launch)
		return s.enqueue(op{kind: "kernel " + fn.name + " (dry)", compute: true, run: func() (time.Duration, error) {
			return d, nil
		}})
	}
	l := launch{grid: norm(grid), block: norm(block), args: append([]byte(nil), args...), params: fn.params}
	if w := fn.work(l); w > s.b.opts.MaxKernelOps {
		return fmt.Errorf("%w: sim: kernel %s would do %d element operations, more than the %d the simulated GPU "+
			"computes in one launch (grid %v, block %v)", ErrKernelTooLarge, fn.name, w, s.b.opts.MaxKernelOps,
			l.grid, l.block)
	}
	return s.enqueue(op{kind: "kernel " + fn.name, compute: true, run: func() (time.Duration, error) {
		bytes, flops, err := fn.kernel(s.b, s.who, l)
		if err != nil {
			return 0, err
		}
		if fn.time != nil {
			return fn.time(l), nil
		}
		work := s.b.opts.LaunchLatency + max(s.b.memTime(bytes), time.Duration(flops/s.b.opts.FLOPS*1e9))
		return s.b.kernelTime(fn.name, work), nil
	}})
}

// kernelTime is the GPU time of one launch of kernel name: the profile's, else def (LaunchLatency when 0).
func (b *Backend) kernelTime(name string, def time.Duration) time.Duration {
	if d, ok := b.opts.Profile.Kernels[name]; ok {
		return d
	}
	if def > 0 {
		return def
	}
	return b.opts.LaunchLatency
}

// notComputed is the error of launching a kernel the sim cannot compute (outside dry mode).
func (b *Backend) notComputed(fn *function) error {
	why := ""
	if fn.unlike != "" {
		why = "; it is named like a reference kernel but " + fn.unlike
	}
	return fmt.Errorf("%w: sim: kernel %s of %s cannot be computed by the simulated GPU, which computes only its "+
		"reference kernels (%s)%s; a gpuserver run with --sim-kernels=dry accepts it without executing it",
		ErrKernelNotSimulated, fn.name, fn.mod.source, referenceList, why)
}

func norm(d device.Dim3) device.Dim3 {
	if d.X == 0 {
		d.X = 1
	}
	if d.Y == 0 {
		d.Y = 1
	}
	if d.Z == 0 {
		d.Z = 1
	}
	return d
}

func (b *Backend) memTime(bytes uint64) time.Duration {
	return time.Duration(float64(bytes) / b.opts.MemoryBytesPerSec * 1e9)
}

func (s *stream) Record(e device.Event) error {
	ev, ok := e.(*event)
	if !ok || ev.b != s.b {
		return fmt.Errorf("%w: event of another backend", device.ErrInvalidValue)
	}
	gen := &eventGen{done: make(chan struct{})}
	if err := s.enqueue(op{record: gen}); err != nil {
		return err
	}
	ev.mu.Lock()
	ev.cur = gen
	ev.mu.Unlock()
	return nil
}

func (s *stream) Wait(e device.Event) error {
	ev, ok := e.(*event)
	if !ok || ev.b != s.b {
		return fmt.Errorf("%w: event of another backend", device.ErrInvalidValue)
	}
	ev.mu.Lock()
	gen := ev.cur
	ev.mu.Unlock()
	if gen == nil {
		return nil
	}
	return s.enqueue(op{wait: gen})
}

func (s *stream) Synchronize(ctx context.Context) error {
	ch := make(chan syncResult, 1)
	if err := s.enqueue(op{sync: ch}); err != nil {
		return err
	}
	select {
	case r := <-ch:
		if err := s.b.waitUntil(ctx, r.at); err != nil {
			return err
		}
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		if s.ctx != nil { // its context was destroyed under it
			if err := s.ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("%w: the stream's context was destroyed", device.ErrInvalidValue)
		}
		return fmt.Errorf("sim: %w: stream stopped", device.ErrUnavailable)
	}
}

func (s *stream) Destroy() error {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return fmt.Errorf("%w: stream destroyed twice", device.ErrInvalidValue)
	}
	s.mu.Unlock()
	s.stop()
	<-s.done
	s.b.mu.Lock()
	delete(s.b.streams, s)
	s.b.mu.Unlock()
	if s.ctx != nil {
		s.ctx.forget(s)
	}
	return nil
}

// event is a simulated CUDA event.
type event struct {
	b      *Backend
	gpu    int
	timing bool
	mu     sync.Mutex
	cur    *eventGen
}

// eventGen is one Record of an event. done closes when the stream reached the record (at is set then); the
// work before it completes at at (modelled), which in the timed mode may lie ahead.
type eventGen struct {
	done chan struct{}
	err  error
	at   time.Time // when the work before it completed (modelled)
}

func (g *eventGen) finish(err error) {
	g.err = err
	close(g.done)
}

// NewEvent creates an event.
func (b *Backend) NewEvent(gpu int) (device.Event, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	return &event{b: b, gpu: gpu}, nil
}

// NewTimedEvent creates an event that records its completion time.
func (b *Backend) NewTimedEvent(gpu int) (device.Event, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	return &event{b: b, gpu: gpu, timing: true}, nil
}

// Elapsed is the modelled time between start's completion and e's.
func (e *event) Elapsed(start device.Event) (time.Duration, error) {
	s, ok := start.(*event)
	if !ok || s.b != e.b || s.gpu != e.gpu || !s.timing || !e.timing {
		return 0, fmt.Errorf("%w: elapsed time needs two timing events of one GPU", device.ErrInvalidValue)
	}
	gs, ge := s.gen(), e.gen()
	if gs == nil || ge == nil {
		return 0, fmt.Errorf("%w: event never recorded", device.ErrInvalidValue)
	}
	for _, g := range []*eventGen{gs, ge} {
		if !e.b.completed(g) {
			return 0, device.ErrNotReady
		}
	}
	return ge.at.Sub(gs.at), nil
}

func (e *event) gen() *eventGen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// completed reports whether the work before g completed: its stream reached it and, in the timed mode, its
// modelled time passed.
func (b *Backend) completed(g *eventGen) bool {
	select {
	case <-g.done:
		return !b.timed() || !b.clock.Now().Before(g.at)
	default:
		return false
	}
}

func (e *event) Query() (bool, error) {
	g := e.gen()
	if g == nil {
		return true, nil
	}
	if !e.b.completed(g) {
		return false, nil
	}
	return true, g.err
}

func (e *event) Synchronize(ctx context.Context) error {
	g := e.gen()
	if g == nil {
		return nil
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.b.ctx.Done():
		return fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	if err := e.b.waitUntil(ctx, g.at); err != nil {
		return err
	}
	return g.err
}

func (e *event) Destroy() error { return nil }

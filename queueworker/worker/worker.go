// Package worker is faas-gpu's queue worker: it consumes asynchronous invocations from JetStream with a durable
// pull consumer, orders them in a bounded lookahead window with the gpuserver's queueing policy (SLO-aware by
// default, FIFO on request), admits GPU functions by the pool's capacity, invokes each function through the
// gateway, POSTs the result to the call's X-Callback-Url, and acks the message only once the call has finished
// (success or final failure). Failed invocations are retried with a capped exponential backoff through JetStream
// (nak with delay); messages it gives up on go to the dead-letter stream with the reason.
package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/queueing"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// fetchWait bounds one pull request; it is also how long the pullers take to notice shutdown.
const fetchWait = 500 * time.Millisecond

// Worker consumes queued invocations. Create it with New and run it with Run.
type Worker struct {
	cfg     Config
	m       *metrics
	started atomic.Bool
	// ownClient: the HTTP client was made by New, so Run closes its idle connections when it returns.
	ownClient bool
	gateway   *url.URL     // GatewayURL, parsed
	callbacks *http.Client // the callback client (callbackGuard)

	mu          sync.Mutex
	q           *queueing.Queue
	held        map[uint64]*message // every message delivered to this worker and not yet acked or nakked
	nextID      uint64
	reserved    int // window slots reserved by open pull requests
	reservedQ   map[string]int
	heldQ       map[string]int // held messages per queue
	inflight    int
	gpuInflight int
	gpuLimit    int // -1: not limited by the pool
	isGPU       map[string]bool
	fnQueue     map[string]string        // function -> queue of its latest message
	inflightQ   map[string]int           // running invocations per queue
	cost        map[string]time.Duration // per function, moving average of invocation time
	maxInflight int
	capacity    int // lookahead window + maxInflight: most messages held at once
	queues      int // queues consumed (pullers share the window)
	orderOps    int64
	orderTime   time.Duration

	wake  chan struct{} // dispatcher: something to dispatch or a slot freed
	space chan struct{} // closed (and replaced) when held or reserved went down: wakes every waiting puller
	tasks sync.WaitGroup
	// runCtx is the context of invocations, callbacks and dead-lettering: it outlives Run's ctx by at most
	// DrainTimeout. Set by Run before any goroutine starts.
	runCtx context.Context
}

// message is one delivered message with what the worker learnt from it.
type message struct {
	id       uint64
	msg      jetstream.Msg
	queue    string
	req      types.QueueRequest
	parsed   bool // req was decoded from the message (else the message is not a queue request)
	fn       functions.Function
	callID   string
	start    time.Time // when the call entered the system
	delivery int       // JetStream's delivery count, from 1
	seq      uint64    // stream sequence
}

// Stats is a snapshot of the worker's state.
type Stats struct {
	// Held messages: in the window, running, or calling back.
	Held int
	// Inflight invocations.
	Inflight int
	// Window is the number of messages waiting to be dispatched.
	Window int
	// OrderingOps is the number of push and pop operations on the ordering policy, OrderingTime their total time.
	OrderingOps  int64
	OrderingTime time.Duration
	// MaxInflight and Capacity (window + inflight) in effect.
	MaxInflight, Capacity int
}

// New validates cfg and returns a worker; it does no I/O.
func New(cfg Config) (*Worker, error) {
	ownClient := cfg.Client == nil
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	q, err := queueing.New(queueing.Config{Order: cfg.Order})
	if err != nil {
		return nil, fmt.Errorf("%w: Order: %w", ErrInvalidConfig, err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	gateway, err := url.Parse(cfg.GatewayURL)
	if err != nil {
		return nil, fmt.Errorf("%w: GatewayURL: %w", ErrInvalidConfig, err)
	}
	return &Worker{
		cfg: cfg, m: m, q: q, ownClient: ownClient, gateway: gateway,
		callbacks: newCallbackGuard(cfg.ForbiddenCallbackHosts).client(),
		held:      map[uint64]*message{},
		heldQ:     map[string]int{},
		reservedQ: map[string]int{},
		isGPU:     map[string]bool{},
		fnQueue:   map[string]string{},
		inflightQ: map[string]int{},
		cost:      map[string]time.Duration{},
		gpuLimit:  -1,
		wake:      make(chan struct{}, 1),
		space:     make(chan struct{}),
	}, nil
}

// Stats returns a snapshot of the worker's state.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Stats{Held: len(w.held), Inflight: w.inflight, Window: w.q.Len(), OrderingOps: w.orderOps,
		OrderingTime: w.orderTime, MaxInflight: w.maxInflight, Capacity: w.capacity}
}

// Run consumes until ctx ends, then drains: it stops pulling, gives the messages still waiting in its window back
// to JetStream, waits (at most DrainTimeout) for running invocations and their callbacks, and returns nil. It
// returns an error only when it cannot start (streams or consumers cannot be created). Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: Run called twice")
	}
	js := w.cfg.JetStream
	if js == nil {
		log := w.cfg.Logger
		opts := []nats.Option{nats.Name("faas-gpu queue-worker"), nats.MaxReconnects(-1),
			nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(false),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				log.Debug("queue worker: NATS asynchronous error", "err", err)
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err == nil {
					return // closed by us
				}
				log.Warn("queue worker: disconnected from NATS; reconnecting", "err", err)
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				log.Info("queue worker: reconnected to NATS", "url", nc.ConnectedUrlRedacted())
			})}
		if w.cfg.NATSUser != "" {
			opts = append(opts, nats.UserInfo(w.cfg.NATSUser, w.cfg.NATSPassword))
		}
		nc, err := nats.Connect(w.cfg.NATSURL, opts...)
		if err != nil {
			return fmt.Errorf("worker: connecting to NATS at %s: %w", redactURL(w.cfg.NATSURL), err)
		}
		defer nc.Close()
		js, err = jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("worker: jetstream: %w", err)
		}
	}
	if err := queue.ApplyLimits(ctx, js, w.cfg.limits(), w.cfg.Queues...); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.dropDeadLetterConsumer(ctx, js)
	consumers := map[string]jetstream.Consumer{}
	for _, q := range w.cfg.Queues {
		c, err := w.consumer(ctx, js, q)
		if err != nil {
			return err
		}
		consumers[q] = c
	}
	w.mu.Lock()
	w.queues = len(consumers)
	w.mu.Unlock()
	w.size(ctx)

	// Invocations and callbacks run on runCtx, which outlives ctx by at most DrainTimeout.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	w.runCtx = runCtx

	var loops sync.WaitGroup
	for q, c := range consumers {
		loops.Go(func() { w.pull(ctx, q, c, js) })
	}
	var depth depthSet
	depth.set(consumers)
	if lister, ok := w.cfg.Functions.(functions.Lister); ok && w.cfg.DiscoverQueues >= 0 {
		loops.Go(func() {
			w.discoverLoop(ctx, js, lister, consumers, func(q string, c jetstream.Consumer) {
				depth.add(q, c)
				loops.Go(func() { w.pull(ctx, q, c, js) })
			})
		})
	}
	loops.Go(func() { w.dispatchLoop(ctx, js) })
	if w.cfg.Capacity != nil {
		loops.Go(func() { w.capacityLoop(ctx) })
	}
	loops.Go(func() { w.depthLoop(ctx, &depth) })
	progressCtx, stopProgress := context.WithCancel(context.WithoutCancel(ctx))
	var progress sync.WaitGroup
	progress.Go(func() { w.progressLoop(progressCtx) })

	<-ctx.Done()
	loops.Wait()
	w.giveBackWindow()
	done := make(chan struct{})
	go func() { w.tasks.Wait(); close(done) }()
	timer := time.NewTimer(w.cfg.DrainTimeout)
	select {
	case <-done:
	case <-timer.C:
		w.cfg.Logger.Warn("queue worker: drain timeout, cancelling running invocations", "running", w.Stats().Inflight)
		cancelRun()
		<-done
	}
	timer.Stop()
	stopProgress()
	progress.Wait()
	if nc := js.Conn(); nc != nil && w.cfg.JetStream == nil {
		_ = nc.Flush() // the acks and naks of the drain reach the server before the connection closes
	}
	if w.ownClient {
		w.cfg.Client.CloseIdleConnections()
	}
	w.callbacks.CloseIdleConnections()
	return nil
}

// redactURL hides the password of a URL that carries one.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// size fixes MaxInflight and the window from the config and, when set, the pool's capacity.
func (w *Worker) size(ctx context.Context) {
	slots := -1
	if w.cfg.Capacity != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := w.cfg.Capacity.Status(sctx)
		cancel()
		if err != nil {
			w.cfg.Logger.Warn("queue worker: reading pool capacity failed; GPU dispatch not limited until it succeeds", "err", err)
		} else {
			slots = healthyGPUs(st) * w.cfg.CapacityPerGPU
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gpuLimit = slots
	w.maxInflight = w.cfg.MaxInflight
	if w.maxInflight == 0 {
		w.maxInflight = max(16, 2*slots)
	}
	look := w.cfg.Lookahead
	if look == 0 {
		look = max(1024, 4*w.maxInflight)
	}
	w.capacity = look + w.maxInflight
}

// signal wakes a goroutine waiting on ch without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// release forgets a message that was acked or nakked.
func (w *Worker) release(m *message) {
	w.mu.Lock()
	delete(w.held, m.id)
	w.heldQ[m.queue]--
	n := len(w.held)
	w.spaceFreedLocked()
	w.mu.Unlock()
	w.m.held.Set(float64(n))
}

// spaceFreedLocked wakes every puller waiting for room in the window. Called with w.mu held.
func (w *Worker) spaceFreedLocked() {
	close(w.space)
	w.space = make(chan struct{})
}

// giveBackWindow naks every message still waiting for dispatch, so that another worker gets it at once.
func (w *Worker) giveBackWindow() {
	w.mu.Lock()
	var back []*message
	for {
		r, ok := w.q.Pop(w.cfg.Now(), nil)
		if !ok {
			break
		}
		back = append(back, r.Payload.(*message))
	}
	w.mu.Unlock()
	for _, m := range back {
		if err := m.msg.Nak(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			w.cfg.Logger.Warn("queue worker: nak on drain failed; redelivered after ack wait", "request_id", m.callID, "err", err)
		}
		w.release(m)
	}
}

// progressLoop extends the lease of every held message (in-progress ack) every AckWait/3.
func (w *Worker) progressLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.AckWait / 3)
	defer t.Stop()
	var msgs []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		msgs = msgs[:0]
		w.mu.Lock()
		for _, m := range w.held {
			msgs = append(msgs, m.msg)
		}
		w.mu.Unlock()
		for _, msg := range msgs {
			_ = msg.InProgress() // a lost in-progress ack at worst causes a redelivery (at-least-once)
		}
	}
}

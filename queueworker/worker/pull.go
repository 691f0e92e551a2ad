package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/queueing"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// pull fetches messages of one queue into the window while it has room, until ctx ends.
func (w *Worker) pull(ctx context.Context, q string, c jetstream.Consumer, js jetstream.JetStream) {
	failures := 0
	for ctx.Err() == nil {
		n := w.reserve(ctx, q)
		if n == 0 {
			return
		}
		batch, err := c.Fetch(n, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			w.unreserve(q, n)
			c = w.recreateIfGone(ctx, js, q, c, err)
			failures++
			if failures == 1 || failures%20 == 0 {
				w.cfg.Logger.Warn("queue worker: fetch failed; retrying", "queue", q, "err", err, "failures", failures)
			}
			if !sleep(ctx, min(time.Duration(failures)*100*time.Millisecond, 2*time.Second)) {
				return
			}
			continue
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			w.accept(ctx, q, msg, js)
		}
		w.unreserve(q, n-got)
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) &&
			!errors.Is(err, context.DeadlineExceeded) {
			c = w.recreateIfGone(ctx, js, q, c, err)
			failures++
			if failures == 1 || failures%20 == 0 {
				w.cfg.Logger.Warn("queue worker: fetch ended with an error; retrying", "queue", q, "err", err, "failures", failures)
			}
			if !sleep(ctx, min(time.Duration(failures)*100*time.Millisecond, 2*time.Second)) {
				return
			}
			continue
		}
		failures = 0
	}
}

// reserve waits until the window has room for queue q and reserves slots for one pull request; it returns 0
// when ctx ends. Each queue may hold at most its share of the window (capacity / queues), so that a backlog on
// one queue cannot take the window from the others.
func (w *Worker) reserve(ctx context.Context, q string) int {
	for {
		w.mu.Lock()
		share := max(1, w.capacity/max(1, w.queues))
		free := min(w.capacity-len(w.held)-w.reserved, share-w.heldQ[q]-w.reservedQ[q])
		if free > 0 {
			w.reserved += free
			w.reservedQ[q] += free
			w.mu.Unlock()
			return free
		}
		space := w.space
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0
		case <-space:
		}
	}
}

func (w *Worker) unreserve(q string, n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.reserved -= n
	w.reservedQ[q] -= n
	w.spaceFreedLocked()
	w.mu.Unlock()
}

// accept turns one delivered message into a window entry, or into a final outcome (dead letter, with a callback
// where the message names one) when it cannot be invoked.
func (w *Worker) accept(ctx context.Context, q string, msg jetstream.Msg, js jetstream.JetStream) {
	m := &message{msg: msg, queue: q, delivery: 1}
	if md, err := msg.Metadata(); err == nil {
		m.delivery, m.seq, m.start = int(md.NumDelivered), md.Sequence.Stream, md.Timestamp
	}
	if m.delivery > 1 {
		w.m.redeliveries.Inc()
	}
	w.mu.Lock()
	w.reserved--
	w.reservedQ[q]--
	w.heldQ[q]++
	w.nextID++
	m.id = w.nextID
	w.held[m.id] = m
	held := len(w.held)
	w.mu.Unlock()
	w.m.held.Set(float64(held))

	fail := func(reason, detail string, status int) {
		w.tasks.Go(func() {
			w.complete(w.runCtx, js, m, outcome{status: status, body: []byte(detail + "\n"), reason: reason, detail: detail})
		})
	}
	data := msg.Data()
	if len(data) > w.cfg.MaxMessageBytes {
		fail(ReasonOversized, fmt.Sprintf("message of %d bytes exceeds the worker's limit of %d bytes", len(data), w.cfg.MaxMessageBytes), 0)
		return
	}
	if err := json.Unmarshal(data, &m.req); err != nil {
		m.req = types.QueueRequest{}
		fail(ReasonMalformed, "message is not a JSON queue request: "+err.Error(), 0)
		return
	}
	m.parsed = true
	m.callID = m.req.Header.Get(queue.HeaderCallID)
	if m.callID == "" {
		m.callID = q + "-" + strconv.FormatUint(m.seq, 10)
	}
	if ns, err := strconv.ParseInt(m.req.Header.Get(queue.HeaderStartTime), 10, 64); err == nil && ns > 0 {
		m.start = time.Unix(0, ns)
	}
	if err := queue.CheckRequest(&m.req); err != nil {
		fail(ReasonMalformed, err.Error(), 0)
		return
	}
	if m.delivery > w.cfg.MaxDeliveries {
		fail(ReasonMaxDeliveries, fmt.Sprintf("delivered %d times without finishing (limit %d)", m.delivery, w.cfg.MaxDeliveries),
			http.StatusInternalServerError)
		return
	}
	m.fn = functions.Function{Name: m.req.Function, Queue: q, Percentile: contract.DefaultPercentile}
	if w.cfg.Functions != nil {
		f, err := w.cfg.Functions.Function(ctx, m.req.Function)
		switch {
		case functions.IsUnknown(err) && w.cfg.UnknownGrace > 0 && w.cfg.Now().Sub(m.start) < w.cfg.UnknownGrace:
			// Perhaps deployed a moment ago and not yet in the cached list: look again later.
			if nerr := msg.NakWithDelay(w.cfg.UnknownGrace / 4); nerr != nil {
				w.cfg.Logger.Warn("queue worker: nak failed; redelivered after ack wait", "function", m.req.Function, "request_id", m.callID, "err", nerr)
			}
			w.release(m)
			return
		case functions.IsUnknown(err):
			fail(ReasonUnknownFunction, fmt.Sprintf("function %q not found", m.req.Function), http.StatusNotFound)
			return
		case err != nil:
			// The provider cannot be read: invoke anyway, without SLO; the gateway answers for the function.
			w.cfg.Logger.Debug("queue worker: function lookup failed", "function", m.req.Function, "err", err)
		default:
			m.fn = f
		}
	}

	w.mu.Lock()
	t0 := time.Now()
	err := w.q.SetFunction(m.fn.Name, m.fn.SLO, m.fn.Percentile)
	if err == nil {
		err = w.q.Push(queueing.Request{ID: m.id, Function: m.fn.Name, Arrival: m.start, Cost: w.cost[m.fn.Name], Payload: m})
	}
	d := time.Since(t0)
	w.orderOps++
	w.orderTime += d
	w.isGPU[m.fn.Name] = m.fn.GPU
	w.fnQueue[m.fn.Name] = q
	w.mu.Unlock()
	w.m.orderingNanos.Add(d.Seconds())
	if err != nil {
		// Only a bad SLO or percentile reaches here, and functions.FromAnnotations filters those out.
		fail(ReasonMalformed, "ordering: "+err.Error(), 0)
		return
	}
	signal(w.wake)
}

// recreateIfGone creates the queue's consumer (and stream) again when err says it is gone (deleted by an
// operator, or lost with the stream), and returns the consumer to use from now on.
func (w *Worker) recreateIfGone(ctx context.Context, js jetstream.JetStream, q string, c jetstream.Consumer, err error) jetstream.Consumer {
	if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrConsumerDeleted) &&
		!errors.Is(err, nats.ErrNoResponders) {
		return c
	}
	nc, cerr := w.consumer(ctx, js, q)
	if cerr != nil {
		return c // NATS itself may be away; the next failure tries again
	}
	w.cfg.Logger.Warn("queue worker: consumer was gone; created it again", "queue", q)
	return nc
}

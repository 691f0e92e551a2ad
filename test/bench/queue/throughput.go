package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// ThroughputResult is one order's end-to-end figures with no-op functions.
type ThroughputResult struct {
	Order worker.Ordering
	// Messages delivered (distinct callbacks) and duplicates seen.
	Messages, Duplicates int
	// DrainRate is messages/s from worker start to the last callback over a backlog published beforehand
	// (publish not included).
	DrainRate float64
	// EndToEndRate is messages/s from the first front-door request to the last callback with publishers and the
	// worker running together.
	EndToEndRate float64
	// Latency from X-Start-Time (front door) to the callback's arrival during the end-to-end run.
	P50, P99 time.Duration
	// OrderingPerMessage is the time spent in the ordering policy (push + pop) per message in the drain run.
	OrderingPerMessage time.Duration
	// IdleP50, IdleP99: added latency of one call at a time (closed loop, nothing else queued).
	IdleP50, IdleP99 time.Duration
}

// noop answers 200 with an empty body.
func noop(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
}

// Throughput runs the drain, end-to-end and idle-latency measurements for one order.
func Throughput(ctx context.Context, order worker.Ordering, messages, publishers, idle, maxInflight int) (ThroughputResult, error) {
	res := ThroughputResult{Order: order}
	e, err := newEnv(ctx, http.HandlerFunc(noop), frontdoor.Config{})
	if err != nil {
		return res, err
	}
	defer e.close()
	wcfg := worker.Config{Order: order, MaxInflight: maxInflight, Client: e.client}

	// 1. Drain: a backlog published straight to JetStream (asynchronous publishes), then the worker.
	cbURL := e.cbSrv.URL
	for i := 0; i < messages; i++ {
		id := "drain-" + strconv.Itoa(i)
		data, err := encode(id, cbURL)
		if err != nil {
			return res, err
		}
		msg := &nats.Msg{Subject: queue.Subject(queue.DefaultQueue), Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := e.js.PublishMsgAsync(msg); err != nil {
			return res, fmt.Errorf("bench: publish: %w", err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-ctx.Done():
		return res, ctx.Err()
	}
	w, stop, err := e.startWorker(wcfg)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	if err := e.cb.wait(ctx, messages); err != nil {
		stop()
		return res, err
	}
	res.DrainRate = float64(messages) / time.Since(t0).Seconds()
	st := w.Stats()
	res.OrderingPerMessage = st.OrderingTime / time.Duration(max(1, messages))

	// 2. End to end: publishers through the front door while the worker consumes.
	e.cb.reset()
	t0 = time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := 0; p < publishers; p++ {
		wg.Go(func() {
			for i := p; i < messages; i += publishers {
				if err := e.post(ctx, "noop", "e2e-"+strconv.Itoa(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		stop()
		return res, fmt.Errorf("bench: publishing: %w", err)
	}
	if err := e.cb.wait(ctx, messages); err != nil {
		stop()
		return res, err
	}
	res.EndToEndRate = float64(messages) / time.Since(t0).Seconds()
	lat := latencies(e.cb.snapshot())
	res.P50, res.P99 = percentile(lat, 50), percentile(lat, 99)
	res.Messages = messages
	res.Duplicates = e.cb.duplicates()

	// 3. Idle: one call at a time.
	e.cb.reset()
	for i := 0; i < idle; i++ {
		if err := e.post(ctx, "noop", "idle-"+strconv.Itoa(i)); err != nil {
			stop()
			return res, err
		}
		if err := e.cb.wait(ctx, i+1); err != nil {
			stop()
			return res, err
		}
	}
	lat = latencies(e.cb.snapshot())
	res.IdleP50, res.IdleP99 = percentile(lat, 50), percentile(lat, 99)
	stop()
	return res, nil
}

func encode(id, callback string) ([]byte, error) {
	u, err := url.Parse(callback)
	if err != nil {
		return nil, fmt.Errorf("bench: callback URL: %w", err)
	}
	h := http.Header{}
	h.Set(queue.HeaderCallID, id)
	h.Set(queue.HeaderStartTime, strconv.FormatInt(time.Now().UnixNano(), 10))
	return json.Marshal(types.QueueRequest{Function: "noop", Method: http.MethodPost, Header: h, CallbackURL: u,
		QueueName: queue.DefaultQueue})
}

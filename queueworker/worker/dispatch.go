package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// dispatchLoop starts invocations while there are slots and admissible messages, until ctx ends.
func (w *Worker) dispatchLoop(ctx context.Context, js jetstream.JetStream) {
	// The tick re-evaluates the window when nothing signals: the pool's capacity changed, or slack ran out.
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-t.C:
		}
		w.dispatch(js)
	}
}

// eligible admits a function's next message: GPU functions only while the pool has capacity, and each queue at
// most MaxInflight - (queues - 1) running messages (at least 1), so that one slot is always kept for each other
// queue and a backlog on one queue cannot hold back another. Called with w.mu.
func (w *Worker) eligible(function string) bool {
	if w.gpuLimit >= 0 && w.isGPU[function] && w.gpuInflight >= w.gpuLimit {
		return false
	}
	return w.queues < 2 || w.inflightQ[w.fnQueue[function]] < max(1, w.maxInflight-(w.queues-1))
}

func (w *Worker) dispatch(js jetstream.JetStream) {
	for {
		w.mu.Lock()
		if w.inflight >= w.maxInflight {
			w.mu.Unlock()
			return
		}
		now := w.cfg.Now()
		t0 := time.Now()
		r, ok := w.q.Pop(now, w.eligible)
		d := time.Since(t0)
		w.orderOps++
		w.orderTime += d
		if !ok {
			w.mu.Unlock()
			w.m.orderingNanos.Add(d.Seconds())
			return
		}
		m := r.Payload.(*message)
		w.inflightQ[m.queue]++
		w.inflight++
		if m.fn.GPU {
			w.gpuInflight++
		}
		inflight := w.inflight
		w.mu.Unlock()
		w.m.orderingNanos.Add(d.Seconds())
		w.m.inflight.Set(float64(inflight))
		w.m.dispatched.WithLabelValues(m.fn.Name).Inc()
		w.m.waitSeconds.WithLabelValues(m.fn.Name).Observe(now.Sub(m.start).Seconds())
		w.tasks.Go(func() { w.run(w.runCtx, js, m) })
	}
}

// run invokes one message's function and then retries it (nak with delay) or completes it.
func (w *Worker) run(ctx context.Context, js jetstream.JetStream, m *message) {
	t0 := time.Now()
	out := w.invoke(ctx, m)
	out.duration = time.Since(t0)
	end := w.cfg.Now()

	w.mu.Lock()
	w.inflight--
	w.inflightQ[m.queue]--
	if m.fn.GPU {
		w.gpuInflight--
	}
	inflight := w.inflight
	if c, ok := w.cost[m.fn.Name]; ok {
		w.cost[m.fn.Name] = (4*c + out.duration) / 5
	} else {
		w.cost[m.fn.Name] = out.duration
	}
	w.mu.Unlock()
	w.m.inflight.Set(float64(inflight))
	signal(w.wake)
	w.m.invocations.WithLabelValues(m.fn.Name, strconv.Itoa(out.status)).Inc()

	if ctx.Err() != nil {
		// Drain timeout: give the message back for another worker.
		_ = m.msg.Nak()
		w.release(m)
		return
	}
	retryable := out.err != nil || slices.Contains(w.cfg.RetryStatuses, out.status)
	if retryable && m.delivery < w.cfg.Retry.MaxAttempts {
		w.m.retries.WithLabelValues(m.fn.Name).Inc()
		delay := w.cfg.Retry.Backoff(m.delivery - 1)
		if ra, ok := retryAfter(out.status, out.header); ok {
			delay = max(delay, ra) // the function's node sheds it: not before it said
		}
		if err := m.msg.NakWithDelay(delay); err != nil {
			w.cfg.Logger.Warn("queue worker: nak failed; redelivered after ack wait", "function", m.fn.Name, "request_id", m.callID, "err", err)
		}
		w.release(m)
		return
	}
	if retryable {
		out.reason = ReasonRetriesExhausted
		if out.err != nil {
			out.detail = fmt.Sprintf("%d attempts, last: %v", m.delivery, out.err)
		} else {
			out.detail = fmt.Sprintf("%d attempts, last status %d", m.delivery, out.status)
		}
	}
	latency := end.Sub(m.start)
	onTime := m.fn.SLO > 0 && latency <= m.fn.SLO
	w.mu.Lock()
	w.q.Observe(m.fn.Name, onTime, latency)
	w.mu.Unlock()
	if m.fn.SLO > 0 {
		w.m.served.WithLabelValues(m.fn.Name).Inc()
		if onTime {
			w.m.onTime.WithLabelValues(m.fn.Name).Inc()
		}
	}
	w.complete(ctx, js, m, out)
}

// maxRetryAfter caps the Retry-After the worker honours.
const maxRetryAfter = 5 * time.Minute

// retryAfter reads the Retry-After (seconds, or an HTTP date) of a 429 or 503 answer, capped at maxRetryAfter.
func retryAfter(status int, h http.Header) (time.Duration, bool) {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return 0, false
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return min(time.Duration(n)*time.Second, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(0, time.Until(t)), maxRetryAfter), true
	}
	return 0, false
}

// hopHeaders are not forwarded to the function or the callback.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te",
	"Trailer", "Content-Length", "Host"}

// functionURL is where a message's function is invoked: <gateway>/function/<ref><path>?<query>, built from the
// parts queue.CheckRequest accepted. Path is set decoded and encoded once by net/url, never parsed again, so a
// percent sign in it reaches the gateway as %25 and cannot decode into a path of the gateway's own.
func (w *Worker) functionURL(m *message) *url.URL {
	u := *w.gateway
	u.Path = strings.TrimSuffix(w.gateway.Path, "/") + "/function/" + m.req.Function + m.req.Path
	u.RawPath = ""
	u.RawQuery = m.req.QueryString
	return &u
}

// invoke calls the function once through the gateway.
func (w *Worker) invoke(ctx context.Context, m *message) outcome {
	u := w.functionURL(m).String()
	method := m.req.Method
	if method == "" {
		method = http.MethodPost
	}
	ictx, cancel := context.WithTimeout(ctx, w.cfg.InvokeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ictx, method, u, bytes.NewReader(m.req.Body))
	if err != nil {
		return outcome{status: http.StatusBadRequest, body: []byte(err.Error() + "\n"), reason: ReasonMalformed,
			detail: "building the invocation: " + err.Error()}
	}
	for k, vs := range m.req.Header {
		req.Header[k] = slices.Clone(vs)
	}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	res, err := w.cfg.Client.Do(req)
	if err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
		}
		return outcome{status: status, err: err, body: []byte(err.Error() + "\n")}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, w.cfg.MaxResponseBytes))
	if err != nil {
		return outcome{status: http.StatusBadGateway, err: fmt.Errorf("reading the function's response: %w", err),
			body: []byte(err.Error() + "\n")}
	}
	_, _ = io.Copy(io.Discard, res.Body) // let the connection be reused
	return outcome{status: res.StatusCode, header: res.Header, body: body}
}

// capacityLoop refreshes the GPU admission limit from the pool's status.
func (w *Worker) capacityLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.CapacityRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, w.cfg.CapacityRefresh)
		st, err := w.cfg.Capacity.Status(sctx)
		cancel()
		if err != nil {
			continue // keep the last limit
		}
		w.mu.Lock()
		w.gpuLimit = healthyGPUs(st) * w.cfg.CapacityPerGPU
		w.mu.Unlock()
		signal(w.wake)
	}
}

func healthyGPUs(st pool.Status) int {
	n := 0
	for _, g := range st.GPUs {
		if g.Healthy {
			n++
		}
	}
	return n
}

// depthLoop publishes each queue's backlog (messages not yet delivered) as a gauge.
func (w *Worker) depthLoop(ctx context.Context, depth *depthSet) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for q, c := range depth.snapshot() {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := c.Info(ictx)
			cancel()
			if err == nil {
				w.m.depth.WithLabelValues(q).Set(float64(info.NumPending))
			}
		}
	}
}

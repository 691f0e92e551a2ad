package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// callback is one received callback.
type callback struct {
	header http.Header
	body   string
}

// env is a real JetStream server, a gateway (httptest) serving /function/{name}, a front door and a callback
// receiver.
type env struct {
	t         *testing.T
	js        jetstream.JetStream
	gateway   *httptest.Server
	front     *httptest.Server
	cbServer  *httptest.Server
	mu        sync.Mutex
	callbacks map[string][]callback // by X-Call-Id
	cbStatus  atomic.Int32          // status the callback receiver answers (0: 200)
	reg       *prometheus.Registry
}

func newEnv(t *testing.T, fn http.HandlerFunc) *env {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/function/", fn)
	return newEnvGateway(t, mux)
}

// newEnvGateway is newEnv with the whole gateway's handler.
func newEnvGateway(t *testing.T, gateway http.Handler) *env {
	t.Helper()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	e := &env{t: t, js: js, callbacks: map[string][]callback{}, reg: prometheus.NewRegistry()}
	if err := frontdoor.EnsureStreams(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	e.gateway = httptest.NewServer(gateway)
	t.Cleanup(e.gateway.Close)
	e.front = httptest.NewServer(frontdoor.New(frontdoor.Config{JetStream: js, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}))
	t.Cleanup(e.front.Close)
	e.cbServer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if s := e.cbStatus.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		e.mu.Lock()
		id := r.Header.Get("X-Call-Id")
		e.callbacks[id] = append(e.callbacks[id], callback{r.Header.Clone(), string(b)})
		e.mu.Unlock()
	}))
	t.Cleanup(e.cbServer.Close)
	return e
}

// run starts a worker; it is stopped (and its Run's return checked) when the test ends.
func (e *env) run(cfg worker.Config) *worker.Worker {
	e.t.Helper()
	cfg.JetStream = e.js
	cfg.GatewayURL = e.gateway.URL
	if cfg.Registerer == nil {
		cfg.Registerer = e.reg
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(e.t.Output(), nil))
	}
	w, err := worker.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			e.t.Errorf("Run did not return within 30s of cancel")
		}
	})
	return w
}

// send posts one async call through the front door and returns its call ID.
func (e *env) send(path, body string, header map[string]string) string {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.front.URL+path, strings.NewReader(body))
	req.Header.Set("X-Callback-Url", e.cbServer.URL+"/cb")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		e.t.Fatalf("front door answered %d", res.StatusCode)
	}
	return res.Header.Get("X-Call-Id")
}

func (e *env) callbacksFor(id string) []callback {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]callback(nil), e.callbacks[id]...)
}

func (e *env) waitCallback(id string) callback {
	e.t.Helper()
	testkit.Eventually(e.t, 20*time.Second, fmt.Sprintf("callback for %s", id), func() bool { return len(e.callbacksFor(id)) > 0 })
	return e.callbacksFor(id)[0]
}

// deadLetters reads every entry of the dead-letter stream.
func (e *env) deadLetters() []*nats.Msg {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, queue.DeadLetterStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*nats.Msg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	}
	return out
}

func (e *env) streamMsgs(q string) uint64 {
	st, err := e.js.Stream(context.Background(), queue.Stream(q))
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Echo-Path", r.URL.Path)
	w.Header().Set("X-Echo-Query", r.URL.RawQuery)
	w.Header().Set("X-Echo-Method", r.Method)
	w.Header().Set("X-Echo-Call", r.Header.Get("X-Call-Id"))
	_, _ = w.Write(b)
}

func TestInvokesAndCallsBack(t *testing.T) {
	e := newEnv(t, echo)
	e.run(worker.Config{Order: worker.OrderFIFO})
	id := e.send("/async-function/echo/a/b?q=1", "payload", map[string]string{"X-Call-Id": "call-1"})
	if id != "call-1" {
		t.Fatalf("call id %q", id)
	}
	cb := e.waitCallback(id)
	h := cb.header
	for k, want := range map[string]string{
		"X-Function-Status": "200", "X-Function-Name": "echo", "X-Retry": "0", "X-Retry-Max": "4",
		"X-Echo-Path": "/function/echo/a/b", "X-Echo-Query": "q=1", "X-Echo-Method": "POST", "X-Echo-Call": "call-1",
		"Content-Type": "text/plain",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("callback header %s = %q, want %q", k, got, want)
		}
	}
	if d, err := strconv.ParseFloat(h.Get("X-Duration-Seconds"), 64); err != nil || d < 0 {
		t.Errorf("X-Duration-Seconds %q", h.Get("X-Duration-Seconds"))
	}
	if cb.body != "payload" {
		t.Errorf("callback body %q", cb.body)
	}
	testkit.Eventually(t, 10*time.Second, "message acked and removed", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
	if got := metricValue(t, e.reg, "faas_gpu_queue_dispatched_total", map[string]string{"function": "echo"}); got != 1 {
		t.Errorf("dispatched metric %v, want 1", got)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_invocations_total", map[string]string{"function": "echo", "code": "200"}); got != 1 {
		t.Errorf("invocations metric %v, want 1", got)
	}
}

// With one invocation at a time and FIFO order, functions are invoked in publish order.
func TestFIFOOrder(t *testing.T) {
	var mu sync.Mutex
	var order []string
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		order = append(order, string(b))
		mu.Unlock()
	})
	const n = 50
	ids := make([]string, n)
	for i := range n {
		ids[i] = e.send("/async-function/f", strconv.Itoa(i), nil)
	}
	e.run(worker.Config{Order: worker.OrderFIFO, MaxInflight: 1})
	for _, id := range ids {
		e.waitCallback(id)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, got := range order {
		if got != strconv.Itoa(i) {
			t.Fatalf("invocation %d was message %s; order %v", i, got, order)
		}
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	e.run(worker.Config{Retry: worker.RetryPolicy{MaxAttempts: 4, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}})
	id := e.send("/async-function/flaky", "x", nil)
	cb := e.waitCallback(id)
	if cb.header.Get("X-Function-Status") != "200" || cb.header.Get("X-Retry") != "2" || cb.header.Get("X-Retry-Max") != "3" || cb.body != "ok" {
		t.Fatalf("callback %v %q", cb.header, cb.body)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_retries_total", nil); got != 2 {
		t.Fatalf("retries metric %v, want 2", got)
	}
}

func TestRetriesExhaustedGoToDeadLetters(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "down")
	})
	e.run(worker.Config{Retry: worker.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}})
	id := e.send("/async-function/broken", "x", nil)
	cb := e.waitCallback(id)
	if cb.header.Get("X-Function-Status") != "502" || cb.header.Get("X-Retry") != "2" || cb.body != "down" {
		t.Fatalf("callback %v %q", cb.header, cb.body)
	}
	var dl []*nats.Msg
	testkit.Eventually(t, 10*time.Second, "one dead letter", func() bool { dl = e.deadLetters(); return len(dl) == 1 })
	if r := dl[0].Header.Get(queue.HeaderDeadLetterReason); !strings.HasPrefix(r, worker.ReasonRetriesExhausted) ||
		dl[0].Header.Get(queue.HeaderCallID) != id || dl[0].Subject != "faas-dead-letter.faas-request" {
		t.Fatalf("dead letter %s %v", dl[0].Subject, dl[0].Header)
	}
	testkit.Eventually(t, 10*time.Second, "message acked", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
}

// Malformed messages go to the dead letters with a reason and do not block the messages behind them.
func TestMalformedMessagesDoNotBlock(t *testing.T) {
	e := newEnv(t, echo)
	ctx := context.Background()
	known := functionsMap{"echo": {Name: "echo", Queue: queue.DefaultQueue}}
	// Published before the worker starts, so they are first in line.
	if _, err := e.js.Publish(ctx, "faas-request", []byte("this is not json")); err != nil {
		t.Fatal(err)
	}
	big, _ := json.Marshal(types.QueueRequest{Function: "echo", Method: "POST", Body: make([]byte, 4096)})
	if _, err := e.js.Publish(ctx, "faas-request", big); err != nil {
		t.Fatal(err)
	}
	cbURL, _ := url.Parse(e.cbServer.URL + "/cb")
	unknown, _ := json.Marshal(types.QueueRequest{Function: "ghost", Method: "POST", CallbackURL: cbURL,
		Header: http.Header{"X-Call-Id": {"ghost-call"}}})
	if _, err := e.js.Publish(ctx, "faas-request", unknown); err != nil {
		t.Fatal(err)
	}
	climbing, _ := json.Marshal(types.QueueRequest{Function: "echo", Method: "POST", Path: "/../../system/functions"})
	if _, err := e.js.Publish(ctx, "faas-request", climbing); err != nil {
		t.Fatal(err)
	}
	good := e.send("/async-function/echo", "fine", nil)
	e.run(worker.Config{Functions: known, MaxMessageBytes: 2048, MaxInflight: 1, UnknownGrace: -1})
	if cb := e.waitCallback(good); cb.body != "fine" {
		t.Fatalf("good message's callback %q", cb.body)
	}
	if cb := e.waitCallback("ghost-call"); cb.header.Get("X-Function-Status") != "404" {
		t.Fatalf("unknown function's callback status %q", cb.header.Get("X-Function-Status"))
	}
	var dl []*nats.Msg
	testkit.Eventually(t, 10*time.Second, "four dead letters", func() bool { dl = e.deadLetters(); return len(dl) == 4 })
	reasons := map[string]bool{}
	for _, m := range dl {
		r := m.Header.Get(queue.HeaderDeadLetterReason)
		reasons[r[:strings.Index(r, ":")]] = true
	}
	for _, want := range []string{worker.ReasonMalformed, worker.ReasonOversized, worker.ReasonUnknownFunction} {
		if !reasons[want] {
			t.Errorf("no dead letter with reason %s; got %v", want, reasons)
		}
	}
	testkit.Eventually(t, 10*time.Second, "queue emptied", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
}

// A callback endpoint that is down is retried, then counted, logged and dead-lettered; the message is acked.
func TestCallbackDownIsRetriedThenReported(t *testing.T) {
	e := newEnv(t, echo)
	e.cbStatus.Store(http.StatusServiceUnavailable)
	e.run(worker.Config{CallbackRetry: worker.RetryPolicy{MaxAttempts: 3, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	id := e.send("/async-function/echo", "x", nil)
	var dl []*nats.Msg
	testkit.Eventually(t, 10*time.Second, "callback dead letter", func() bool { dl = e.deadLetters(); return len(dl) == 1 })
	if r := dl[0].Header.Get(queue.HeaderDeadLetterReason); !strings.HasPrefix(r, worker.ReasonCallbackFailed) || dl[0].Header.Get(queue.HeaderCallID) != id {
		t.Fatalf("dead letter %v", dl[0].Header)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_callbacks_total", map[string]string{"result": "retried"}); got != 2 {
		t.Errorf("callback retries %v, want 2", got)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_callbacks_total", map[string]string{"result": "failed"}); got != 1 {
		t.Errorf("callback failures %v, want 1", got)
	}
	testkit.Eventually(t, 10*time.Second, "message acked", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
}

// Cancelling Run lets the running invocation finish and its callback go out before Run returns; the message still
// waiting in the window is given back. No timing decides the outcome: the function is released only once the
// worker has been seen draining (the waiting message given back while the running one is held).
func TestGracefulDrain(t *testing.T) {
	started := make(chan struct{}, 1)
	releaseFn := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-releaseFn
		_, _ = io.WriteString(w, "done")
	})
	w, err := worker.New(worker.Config{JetStream: e.js, GatewayURL: e.gateway.URL, MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := e.send("/async-function/slow", "1", nil)
	e.send("/async-function/slow", "2", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-started
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("the second message waiting in the window (stats %+v)", w.Stats()), func() bool { s := w.Stats(); return s.Held == 2 && s.Window == 1 })
	cancel()
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("the waiting message given back while the running one is held (stats %+v)", w.Stats()), func() bool { s := w.Stats(); return s.Held == 1 && s.Window == 0 })
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while an invocation was running", err)
	default:
	}
	close(releaseFn)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(e.callbacksFor(first)) != 1 {
		t.Fatalf("first call's callback did not go out before Run returned")
	}
	// The second message was given back, not lost.
	if n := e.streamMsgs(queue.DefaultQueue); n != 1 {
		t.Fatalf("stream holds %d messages after drain, want 1 (the undispatched one)", n)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  worker.Config
		want string
	}{
		{worker.Config{GatewayURL: "http://x"}, "JetStream or NATSURL"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "x"}, "GatewayURL"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "http://x", AckWait: time.Millisecond}, "AckWait"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "http://x", MaxInflight: -1}, "MaxInflight"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "http://x", Order: "random"}, "Order"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "http://x", Queues: []string{"a.b"}}, "Queues"},
		{worker.Config{NATSURL: "nats://x", GatewayURL: "http://x", Retry: worker.RetryPolicy{MaxAttempts: 0, InitialBackoff: 1}}, "Retry.MaxAttempts"},
	} {
		_, err := worker.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

type functionsMap map[string]functions.Function

func (f functionsMap) Function(_ context.Context, name string) (functions.Function, error) {
	if fn, ok := f[name]; ok {
		return fn, nil
	}
	return functions.Function{}, fmt.Errorf("%w: %s", functions.ErrUnknownFunction, name)
}

// metricValue sums the samples of a counter or gauge whose labels include want.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

// A call that runs longer than the ack wait keeps its lease through in-progress acks: it is invoked once. The ack
// wait is 3s (in-progress acks every second) and the call lasts 2.5 ack waits, so a lapse would take a worker
// stalled for seconds; the outcome is decided by the worker's acks, not by how long the call takes.
func TestLongCallKeepsItsLease(t *testing.T) {
	const ackWait = 3 * time.Second
	var calls atomic.Int32
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select { // several ack waits
		case <-time.After(ackWait * 5 / 2):
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "slow")
	})
	e.run(worker.Config{AckWait: ackWait})
	id := e.send("/async-function/slow", "x", nil)
	if cb := e.waitCallback(id); cb.body != "slow" || cb.header.Get("X-Retry") != "0" {
		t.Fatalf("callback %v %q", cb.header, cb.body)
	}
	testkit.Eventually(t, 10*time.Second, "acked", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("function invoked %d times, want 1 (the lease lapsed)", n)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_redeliveries_total", nil); got != 0 {
		t.Fatalf("%v redeliveries, want 0", got)
	}
}

// A consumer deleted under a running worker is created again, and calls keep flowing.
func TestDeletedConsumerIsRecreated(t *testing.T) {
	e := newEnv(t, echo)
	e.run(worker.Config{Durable: "qw"})
	e.waitCallback(e.send("/async-function/echo", "1", nil))
	if err := e.js.DeleteConsumer(context.Background(), queue.Stream(queue.DefaultQueue), "qw"); err != nil {
		t.Fatal(err)
	}
	e.waitCallback(e.send("/async-function/echo", "2", nil))
}

// Run leaves no goroutine behind when it returns (its own NATS connection and HTTP connections included). The
// first run creates the stream and the consumer (goroutines of the NATS server that stay); the second is checked.
func TestRunLeavesNoGoroutines(t *testing.T) {
	s := jstest.Server(t)
	gw := httptest.NewServer(http.HandlerFunc(echo))
	defer gw.Close()
	got := make(chan string, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Get("X-Call-Id") }))
	defer cb.Close()
	_, js := jstest.Connect(t, s.ClientURL())
	u, _ := url.Parse(cb.URL)

	runOnce := func(id string) {
		w, err := worker.New(worker.Config{NATSURL: s.ClientURL(), NATSUser: jstest.User, NATSPassword: jstest.Password,
			GatewayURL: gw.URL, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		data, _ := json.Marshal(types.QueueRequest{Function: "echo", Method: "POST", CallbackURL: u, Header: http.Header{"X-Call-Id": {id}}})
		testkit.Eventually(t, 10*time.Second, "publish (the worker creates the stream)", func() bool {
			_, err := js.Publish(context.Background(), "faas-request", data)
			return err == nil
		})
		if got := <-got; got != id {
			t.Fatalf("callback for %q, want %q", got, id)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	runOnce("first")
	ignore := goleak.IgnoreCurrent()
	runOnce("second")
	// Goroutines of closed connections (the NATS server's for the worker's client, HTTP keep-alives) end a moment
	// after Run returns: poll with a generous deadline instead of goleak's short built-in retry.
	testkit.EventuallyNil(t, 30*time.Second, "no goroutine left", func() error { return goleak.Find(ignore) })
}

// A message for a function the worker does not know yet is looked at again until the grace period passes: a
// function deployed a moment after its first call is invoked, not dead-lettered. The worker's clock is the test's:
// it stands still until "late" is served, so no load on the machine can make the grace period pass early, then it
// jumps past the grace period so that "ghost" is dead-lettered.
func TestUnknownFunctionGetsAGracePeriod(t *testing.T) {
	e := newEnv(t, echo)
	fns := &lateFunctions{}
	base := time.Now()
	var offset atomic.Int64
	now := func() time.Time { return base.Add(time.Duration(offset.Load())) }
	const grace = 2 * time.Second                                                                 // the nak delay is grace/4
	e.run(worker.Config{Functions: fns, UnknownGrace: grace, Now: now, MaxDeliveries: 1_000_000}) // ghost comes back every grace/4
	start := map[string]string{"X-Start-Time": strconv.FormatInt(base.UnixNano(), 10)}
	ghost := e.send("/async-function/ghost", "x", start)
	id := e.send("/async-function/late", "x", start)
	testkit.Eventually(t, 10*time.Second, "the worker looked the function up", func() bool { return fns.asked.Load() > 0 })
	fns.deployed.Store(true)
	if cb := e.waitCallback(id); cb.header.Get("X-Function-Status") != "200" {
		t.Fatalf("callback status %q, want 200", cb.header.Get("X-Function-Status"))
	}
	if n := len(e.callbacksFor(ghost)); n != 0 {
		t.Fatalf("ghost called back %d times within the grace period", n)
	}
	// A function that never appears is dead-lettered once the grace period has passed.
	offset.Store(int64(grace + time.Second))
	if cb := e.waitCallback(ghost); cb.header.Get("X-Function-Status") != "404" {
		t.Fatalf("ghost callback status %q, want 404", cb.header.Get("X-Function-Status"))
	}
	dl := e.deadLetters()
	if len(dl) != 1 || dl[0].Header.Get(queue.HeaderDeadLetterFunction) != "ghost" {
		t.Fatalf("dead letters %v, want one for ghost", dl)
	}
}

// lateFunctions knows function "late" only once deployed is set.
type lateFunctions struct {
	deployed atomic.Bool
	asked    atomic.Int32
}

func (l *lateFunctions) Function(_ context.Context, name string) (functions.Function, error) {
	l.asked.Add(1)
	if name == "late" && l.deployed.Load() {
		return functions.Function{Name: name, Queue: queue.DefaultQueue}, nil
	}
	return functions.Function{}, functions.ErrUnknownFunction
}

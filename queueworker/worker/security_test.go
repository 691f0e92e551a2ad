package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// gatewayLog records every request path the gateway saw; /system/* answers as a provider API would.
type gatewayLog struct {
	mu    sync.Mutex
	paths []string
}

func (g *gatewayLog) handler(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.paths = append(g.paths, r.Method+" "+r.URL.Path)
		g.mu.Unlock()
		fn(w, r)
	}
}

func (g *gatewayLog) system() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, p := range g.paths {
		if strings.Contains(p, "/system") {
			out = append(out, p)
		}
	}
	return out
}

// newSecEnv is newEnv whose gateway also serves /system/ (recorded) beside /function/.
func newSecEnv(t *testing.T, fn http.HandlerFunc) (*env, *gatewayLog) {
	log := &gatewayLog{}
	mux := http.NewServeMux()
	mux.HandleFunc("/function/", log.handler(fn))
	mux.HandleFunc("/system/", log.handler(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted) // a deploy that went through
	}))
	return newEnvGateway(t, mux), log
}

func (e *env) publish(req types.QueueRequest) {
	e.t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.js.Publish(context.Background(), queue.Subject(queue.DefaultQueue), data); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deadLetterReasons() map[string]string {
	out := map[string]string{}
	for _, m := range e.deadLetters() {
		r := m.Header.Get(queue.HeaderDeadLetterReason)
		out[m.Header.Get(queue.HeaderCallID)] = r[:strings.Index(r, ":")]
	}
	return out
}

// The call faas-cli makes (POST /async-function/echo.openfaas-fn) is looked up in its namespace
// and invoked as /function/echo.openfaas-fn, which the gateway's proxy splits.
func TestNameDotNamespaceIsInvoked(t *testing.T) {
	e := newEnv(t, echo)
	fns := functionsMap{"echo.openfaas-fn": {Name: "echo", Queue: queue.DefaultQueue}}
	front := httptest.NewServer(frontdoor.New(frontdoor.Config{JetStream: e.js, Functions: fns}))
	defer front.Close()
	e.front = front
	e.run(worker.Config{Functions: fns})
	cb := e.waitCallback(e.send("/async-function/echo.openfaas-fn/sub?x=1", "hi", nil))
	for k, want := range map[string]string{"X-Function-Status": "200", "X-Function-Name": "echo.openfaas-fn",
		"X-Echo-Path": "/function/echo.openfaas-fn/sub", "X-Echo-Query": "x=1"} {
		if got := cb.header.Get(k); got != want {
			t.Errorf("callback %s = %q, want %q", k, got, want)
		}
	}
	if cb.body != "hi" {
		t.Errorf("callback body %q", cb.body)
	}
}

// A message published straight to NATS cannot steer the worker to the gateway's API, however
// its path is encoded; the gateway never sees a /system request.
func TestMessagesCannotReachTheGatewayAPI(t *testing.T) {
	e, gw := newSecEnv(t, echo)
	cb, _ := url.Parse(e.cbServer.URL + "/cb")
	paths := []string{"/%2e%2e/%2e%2e/system/functions", "/%252e%252e/%252e%252e/system/functions", "/../../system/functions",
		"/..%2f..%2fsystem%2ffunctions", "/..\\..\\system\\functions"}
	for i, p := range paths {
		e.publish(types.QueueRequest{Function: "echo", Method: "POST", Path: p, CallbackURL: cb,
			Header: http.Header{"X-Call-Id": {"climb-" + string(rune('a'+i))}}, Body: []byte(`{"service":"evil"}`)})
	}
	e.publish(types.QueueRequest{Function: "echo/../../system/functions", Method: "POST", CallbackURL: cb,
		Header: http.Header{"X-Call-Id": {"climb-name"}}})
	e.publish(types.QueueRequest{Function: "echo", Method: "POST", QueryString: "x HTTP/1.1\r\nHost: evil", CallbackURL: cb,
		Header: http.Header{"X-Call-Id": {"climb-query"}}})
	// A path whose text holds "%2F" (the client sent %252F) reaches the function as that text: never decoded into
	// a slash on the way.
	e.publish(types.QueueRequest{Function: "echo", Method: "POST", Path: "/a%2Fb", CallbackURL: cb,
		Header: http.Header{"X-Call-Id": {"fine"}}})
	e.run(worker.Config{})
	if c := e.waitCallback("fine"); c.header.Get("X-Echo-Path") != "/function/echo/a%2Fb" {
		t.Errorf("path reached the function as %q", c.header.Get("X-Echo-Path"))
	}
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d dead letters", len(paths)+2), func() bool { return len(e.deadLetters()) == len(paths)+2 })
	for id, reason := range e.deadLetterReasons() {
		if reason != worker.ReasonMalformed {
			t.Errorf("%s dead-lettered as %s, want %s", id, reason, worker.ReasonMalformed)
		}
	}
	if sys := gw.system(); len(sys) > 0 {
		t.Fatalf("the gateway's API was reached: %v", sys)
	}
}

// A callback URL that points at the gateway is refused (not retried, dead-lettered) whatever name
// it uses for it, and the worker follows no redirect, from a function or a callback endpoint, to the gateway's API.
func TestCallbacksCannotReachTheGateway(t *testing.T) {
	var e *env
	e, gw := newSecEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/redirect") {
			http.Redirect(w, r, "/system/functions", http.StatusTemporaryRedirect)
			return
		}
		echo(w, r)
	})
	gwURL, _ := url.Parse(e.gateway.URL)
	var aliases []*url.URL
	for _, host := range []string{gwURL.Host, strings.Replace(gwURL.Host, "127.0.0.1", "localhost", 1),
		strings.Replace(gwURL.Host, "127.0.0.1", "127.0.0.2", 1), strings.Replace(gwURL.Host, "127.0.0.1", "[::ffff:127.0.0.1]", 1)} {
		u, _ := url.Parse("http://" + host + "/system/functions")
		aliases = append(aliases, u)
	}
	for i, u := range aliases {
		e.publish(types.QueueRequest{Function: "echo", Method: "POST", CallbackURL: u, Body: []byte(`{"service":"evil"}`),
			Header: http.Header{"X-Call-Id": {"self-" + string(rune('a'+i))}}})
	}
	// A callback endpoint that redirects to the gateway.
	redirector := httptest.NewServer(http.RedirectHandler(e.gateway.URL+"/system/functions", http.StatusTemporaryRedirect))
	defer redirector.Close()
	ru, _ := url.Parse(redirector.URL)
	e.publish(types.QueueRequest{Function: "echo", Method: "POST", CallbackURL: ru, Header: http.Header{"X-Call-Id": {"redirecting-callback"}}})
	// A function that answers with a redirect to the gateway's API: reported as its answer, not followed.
	cb, _ := url.Parse(e.cbServer.URL)
	e.publish(types.QueueRequest{Function: "echo", Method: "POST", Path: "/redirect", CallbackURL: cb,
		Header: http.Header{"X-Call-Id": {"redirecting-function"}}})

	e.run(worker.Config{CallbackRetry: worker.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	if c := e.waitCallback("redirecting-function"); c.header.Get("X-Function-Status") != "307" {
		t.Errorf("redirecting function's callback status %q, want 307", c.header.Get("X-Function-Status"))
	}
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d dead letters", len(aliases)+1), func() bool { return len(e.deadLetters()) == len(aliases)+1 })
	reasons := e.deadLetterReasons()
	for i := range aliases {
		id := "self-" + string(rune('a'+i))
		if reasons[id] != worker.ReasonCallbackRefused {
			t.Errorf("callback to %s: dead-lettered as %q, want %s", aliases[i], reasons[id], worker.ReasonCallbackRefused)
		}
	}
	if reasons["redirecting-callback"] != worker.ReasonCallbackFailed {
		t.Errorf("redirecting callback: dead-lettered as %q, want %s", reasons["redirecting-callback"], worker.ReasonCallbackFailed)
	}
	if sys := gw.system(); len(sys) > 0 {
		t.Fatalf("the gateway's API was reached: %v", sys)
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_callbacks_total", map[string]string{"result": "retried"}); got != 0 {
		t.Errorf("%v callback retries, want 0 (a refused callback is not retried, nor is a 3xx answer)", got)
	}
}

// Dead letters keep no Authorization, Proxy-Authorization or Cookie header; bodies are kept
// unless DeadLetterDropBodies; the stream's retention is the worker's DeadLetterMaxAge.
func TestDeadLettersKeepNoCredentials(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(map[bool]string{false: "keep bodies", true: "drop bodies"}[drop], func(t *testing.T) {
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
			e.run(worker.Config{DeadLetterDropBodies: drop, DeadLetterMaxAge: 36 * time.Hour,
				Retry: worker.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
			id := e.send("/async-function/broken", "the body", map[string]string{"Authorization": "Bearer s3cr3t",
				"Cookie": "session=s3cr3t", "Proxy-Authorization": "Basic s3cr3t", "X-Kept": "yes"})
			e.waitCallback(id)
			var dl []*nats.Msg
			testkit.Eventually(t, 10*time.Second, "one dead letter", func() bool { dl = e.deadLetters(); return len(dl) == 1 })
			if strings.Contains(string(dl[0].Data), "s3cr3t") {
				t.Fatalf("dead letter keeps a credential: %s", dl[0].Data)
			}
			var req types.QueueRequest
			if err := json.Unmarshal(dl[0].Data, &req); err != nil {
				t.Fatal(err)
			}
			if req.Header.Get("X-Kept") != "yes" || req.Function != "broken" {
				t.Errorf("dead letter lost what it should keep: %+v", req)
			}
			if body := string(req.Body); (drop && body != "") || (!drop && body != "the body") {
				t.Errorf("dead-letter body %q with DeadLetterDropBodies %v", body, drop)
			}
			if got := dl[0].Header.Get(queue.HeaderDeadLetterDropped); (got == "body") != drop {
				t.Errorf("%s = %q", queue.HeaderDeadLetterDropped, got)
			}
			st, err := e.js.Stream(context.Background(), queue.DeadLetterStream)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().Config.MaxAge; got != 36*time.Hour {
				t.Errorf("dead-letter max age %s, want 36h", got)
			}
		})
	}
}

// A message that is not a queue request is not kept (its headers cannot be cleaned): the entry says so.
func TestUnparsableDeadLetterIsNotKept(t *testing.T) {
	e := newEnv(t, echo)
	if _, err := e.js.Publish(context.Background(), "faas-request", []byte(`{"Header":{"Authorization":["s3cr3t"]},`)); err != nil {
		t.Fatal(err)
	}
	e.run(worker.Config{})
	var dl []*nats.Msg
	testkit.Eventually(t, 10*time.Second, "one dead letter", func() bool { dl = e.deadLetters(); return len(dl) == 1 })
	if len(dl[0].Data) != 0 || dl[0].Header.Get(queue.HeaderDeadLetterDropped) != "message" ||
		dl[0].Header.Get(queue.HeaderDeadLetterSize) != "39" {
		t.Fatalf("dead letter %v %q", dl[0].Header, dl[0].Data)
	}
}

// countingList is a functions.Lister that counts its calls.
type countingList struct {
	listed
	calls atomic.Int32
}

func (c *countingList) Functions(ctx context.Context) ([]functions.Function, error) {
	c.calls.Add(1)
	return c.listed.Functions(ctx)
}

// A function whose queue is the dead letters' name (deployed before validation existed) never
// makes the worker consume its dead letters, and a consumer an earlier version left on that stream is removed.
func TestNeverConsumesTheDeadLetters(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	ctx := context.Background()
	if _, err := worker.New(worker.Config{JetStream: e.js, GatewayURL: e.gateway.URL, Queues: []string{contract.DeadLetterQueue}}); err == nil ||
		!strings.Contains(err.Error(), "reserved") {
		t.Fatalf("a worker told to consume %s: %v, want a config error saying it is reserved", contract.DeadLetterQueue, err)
	}
	// What an earlier version left behind: its durable consumer on the dead-letter stream, and a dead letter.
	if _, err := e.js.CreateOrUpdateConsumer(ctx, queue.DeadLetterStream, jetstream.ConsumerConfig{Durable: "qw",
		AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.Publish(ctx, queue.DeadLetterSubject(queue.DefaultQueue), []byte(`{"Function":"loop"}`)); err != nil {
		t.Fatal(err)
	}
	fns := &countingList{listed: listed{functionsMap{
		"loop": {Name: "loop", Queue: contract.DeadLetterQueue},
		"echo": {Name: "echo", Queue: queue.DefaultQueue},
	}}}
	e.run(worker.Config{Durable: "qw", Functions: fns, DiscoverQueues: 10 * time.Millisecond,
		Retry: worker.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	testkit.Eventually(t, 20*time.Second, "the worker listed functions 5 times", func() bool { return fns.calls.Load() >= 5 })
	// A call that fails and is dead-lettered while the worker runs.
	e.waitCallback(e.send("/async-function/echo", "x", nil))
	testkit.Eventually(t, 10*time.Second, "two dead letters", func() bool { return len(e.deadLetters()) == 2 })
	testkit.Eventually(t, 20*time.Second, "the worker listed functions 10 times", func() bool { return fns.calls.Load() >= 10 })
	st, err := e.js.Stream(ctx, queue.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 || info.State.Msgs != 2 {
		t.Fatalf("dead-letter stream: %d consumers, %d messages; want 0 and 2", info.State.Consumers, info.State.Msgs)
	}
}

// The worker sends no credentials of its own: an invocation carries the client's headers only, a callback the
// function's answer and the call's metadata only.
func TestCallbacksCarryNoCredentials(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Saw-Authorization", r.Header.Get("Authorization"))
		_, _ = io.WriteString(w, "ok")
	})
	e.run(worker.Config{})
	id := e.send("/async-function/echo", "x", map[string]string{"Authorization": "Bearer client"})
	cb := e.waitCallback(id)
	if cb.header.Get("X-Saw-Authorization") != "Bearer client" {
		t.Errorf("the function saw Authorization %q, want the client's", cb.header.Get("X-Saw-Authorization"))
	}
	if a := cb.header.Get("Authorization"); a != "" {
		t.Errorf("the callback carried Authorization %q", a)
	}
}

// ForbiddenCallbackHosts are matched after name resolution: a host named by name refuses its addresses.
func TestForbiddenCallbackHostsByName(t *testing.T) {
	e := newEnv(t, echo)
	cb, _ := url.Parse(e.cbServer.URL)
	e.run(worker.Config{ForbiddenCallbackHosts: []string{"localhost:" + cb.Port()}})
	id := e.send("/async-function/echo", "x", nil) // calls back to 127.0.0.1:<port>
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("a dead letter for %s", id), func() bool { return e.deadLetterReasons()[id] != "" })
	if r := e.deadLetterReasons()[id]; r != worker.ReasonCallbackRefused {
		t.Fatalf("dead-lettered as %q, want %s", r, worker.ReasonCallbackRefused)
	}
	if n := len(e.callbacksFor(id)); n != 0 {
		t.Fatalf("%d callbacks reached the forbidden host", n)
	}
	if _, err := worker.New(worker.Config{JetStream: e.js, GatewayURL: e.gateway.URL, ForbiddenCallbackHosts: []string{"nohost"}}); err == nil ||
		!strings.Contains(err.Error(), "ForbiddenCallbackHosts") {
		t.Fatalf("a forbidden host without a port: %v, want an error naming ForbiddenCallbackHosts", err)
	}
}

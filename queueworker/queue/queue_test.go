package queue_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// Ensure creates work-queue streams (idempotently) and the dead-letter stream; States reports backlog and
// consumers.
func TestEnsureAndStates(t *testing.T) {
	ctx := context.Background()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	for range 2 {
		if err := queue.Ensure(ctx, js, queue.DefaultQueue, "batch"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, "OF_faas-request")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.Retention != jetstream.WorkQueuePolicy || c.Storage != jetstream.FileStorage || c.Subjects[0] != "faas-request" {
		t.Fatalf("stream config %+v", c)
	}
	if err := queue.Ensure(ctx, js, "bad.name"); !errors.Is(err, contract.ErrInvalidQueueName) {
		t.Fatalf("Ensure(bad.name) = %v", err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "batch", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: queue.DeadLetterSubject("batch"), Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "OF_batch", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Next(jetstream.FetchMaxWait(30 * time.Second)); err != nil { // held, not acked
		t.Fatal(err)
	}
	states, dead, err := queue.States(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if dead != 1 || len(states) != 2 || states[0].Queue != "batch" || states[1].Queue != "faas-request" {
		t.Fatalf("states %+v, dead %d", states, dead)
	}
	if b := states[0]; b.Messages != 3 || b.Pending != 2 || b.AckPending != 1 || b.Consumers != 1 {
		t.Fatalf("batch state %+v", b)
	}
}

// An existing stream keeps the operator's settings.
func TestEnsureKeepsExistingStream(t *testing.T) {
	ctx := context.Background()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	cfg := queue.StreamConfig("tuned")
	cfg.MaxMsgs = 123
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := queue.Ensure(ctx, js, "tuned"); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OF_tuned")
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.MaxMsgs != 123 {
		t.Fatalf("Ensure changed the existing stream: %+v", st.CachedInfo().Config)
	}
}

func TestValidateFunctionName(t *testing.T) {
	for _, ok := range []string{"echo", "hello-gpu", "fn.openfaas-fn", "A_1"} {
		if err := queue.ValidateFunctionName(ok); err != nil {
			t.Errorf("ValidateFunctionName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a..b", ".a", "a.", "a/b", "a?b", "a b", "a.b.c", "a%2e", strings.Repeat("a", 64),
		"a." + strings.Repeat("b", 64)} {
		if err := queue.ValidateFunctionName(bad); !errors.Is(err, queue.ErrInvalidFunctionName) {
			t.Errorf("ValidateFunctionName(%q) = %v, want ErrInvalidFunctionName", bad, err)
		}
	}
}

// "name.namespace" (what faas-cli sends) splits as the synchronous proxy splits it.
func TestSplitFunction(t *testing.T) {
	for ref, want := range map[string][2]string{
		"echo":             {"echo", ""},
		"echo.openfaas-fn": {"echo", "openfaas-fn"},
		"hello-gpu.dev":    {"hello-gpu", "dev"},
	} {
		name, ns, err := queue.SplitFunction(ref)
		if err != nil || name != want[0] || ns != want[1] {
			t.Errorf("SplitFunction(%q) = %q, %q, %v; want %q, %q", ref, name, ns, err, want[0], want[1])
		}
	}
	if _, _, err := queue.SplitFunction("echo."); !errors.Is(err, queue.ErrInvalidFunctionName) || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("SplitFunction(echo.) = %v, want an error naming the namespace", err)
	}
}

// Paths are checked after full decoding, so that no later decoding climbs out of the function.
func TestCheckPath(t *testing.T) {
	for _, ok := range []string{"", "/", "/a/b", "/a b", "/items/a%2Fb", "/100%", "/50%2541", "/..a/b..", "/a/.hidden", "/%zz"} {
		if err := queue.CheckPath(ok); err != nil {
			t.Errorf("CheckPath(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"/../system/functions",
		"/%2e%2e/%2e%2e/system/functions", // what the front door sees of /async-function/echo/%252e%252e/%252e%252e/...
		"/%252e%252e/system",
		"/%25252e%25252e/x",
		"/a/%2E%2E",
		"/.",
		"/./x",
		"/..%2fsystem",
		"/..%5csystem",
		"/a\\..\\b",
		"/a%00b",
		"/a\nb",
		"relative",
		"/%" + strings.Repeat("25", 10) + "2e", // encoded more often than anyone decodes
	} {
		if err := queue.CheckPath(bad); !errors.Is(err, queue.ErrInvalidRequest) || !strings.Contains(err.Error(), "Path") {
			t.Errorf("CheckPath(%q) = %v, want ErrInvalidRequest naming Path", bad, err)
		}
	}
}

func TestCheckRequest(t *testing.T) {
	cb, _ := url.Parse("https://example.com/cb")
	good := types.QueueRequest{Function: "echo.openfaas-fn", Method: "PUT", Path: "/a", QueryString: "x=1&y=%20",
		Header: http.Header{"Content-Type": {"text/plain"}}, CallbackURL: cb}
	if err := queue.CheckRequest(&good); err != nil {
		t.Fatalf("CheckRequest(good) = %v", err)
	}
	ftp, _ := url.Parse("ftp://example.com/x")
	for field, mutate := range map[string]func(*types.QueueRequest){
		"Function":    func(r *types.QueueRequest) { r.Function = "echo/../../system" },
		"Method":      func(r *types.QueueRequest) { r.Method = "CONNECT" },
		"Path":        func(r *types.QueueRequest) { r.Path = "/%2e%2e/system/functions" },
		"QueryString": func(r *types.QueueRequest) { r.QueryString = "a=1 HTTP/1.1\r\nHost: x" },
		"Header":      func(r *types.QueueRequest) { r.Header = http.Header{"X-A": {"1\r\nX-B: 2"}} },
		"CallbackURL": func(r *types.QueueRequest) { r.CallbackURL = ftp },
	} {
		r := good
		mutate(&r)
		if err := queue.CheckRequest(&r); !errors.Is(err, queue.ErrInvalidRequest) || !strings.Contains(err.Error(), field) {
			t.Errorf("bad %s: CheckRequest = %v, want ErrInvalidRequest naming %s", field, err, field)
		}
	}
}

// Dead letters keep no credentials.
func TestWithoutCredentials(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer x"}, "Cookie": {"s=1"}, "Proxy-Authorization": {"Basic y"},
		"authorization": {"lower"}, "Content-Type": {"text/plain"}}
	got := queue.WithoutCredentials(h)
	if len(got) != 1 || got.Get("Content-Type") != "text/plain" {
		t.Fatalf("WithoutCredentials = %v, want only Content-Type", got)
	}
	if h.Get("Authorization") == "" {
		t.Fatal("WithoutCredentials changed its argument")
	}
}

// Only a queue's own work-queue stream may be consumed as that queue.
func TestCheckQueueStream(t *testing.T) {
	if err := queue.CheckQueueStream(queue.StreamConfig("batch"), "batch"); err != nil {
		t.Fatalf("batch's own stream: %v", err)
	}
	if err := queue.CheckQueueStream(queue.DeadLetterStreamConfig(0), contract.DeadLetterQueue); !errors.Is(err, contract.ErrReservedQueueName) {
		t.Fatalf("the dead-letter stream as a queue: %v, want ErrReservedName", err)
	}
	limits := queue.StreamConfig("batch")
	limits.Retention = jetstream.LimitsPolicy
	if err := queue.CheckQueueStream(limits, "batch"); !errors.Is(err, queue.ErrNotAQueue) {
		t.Fatalf("a limits stream as a queue: %v, want ErrNotAQueue", err)
	}
	wide := queue.StreamConfig("batch")
	wide.Subjects = []string{">"}
	if err := queue.CheckQueueStream(wide, "batch"); !errors.Is(err, queue.ErrNotAQueue) {
		t.Fatalf("a stream of every subject as a queue: %v, want ErrNotAQueue", err)
	}
}

// The dead-letter stream's max age is the worker's setting (retention is configurable).
func TestEnsureDeadLetterSetsMaxAge(t *testing.T) {
	ctx := context.Background()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	if err := queue.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	maxAge := func() time.Duration {
		st, err := js.Stream(ctx, queue.DeadLetterStream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.MaxAge
	}
	if got := maxAge(); got != queue.DefaultDeadLetterMaxAge {
		t.Fatalf("default max age %s", got)
	}
	if err := queue.EnsureDeadLetter(ctx, js, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := maxAge(); got != time.Hour {
		t.Fatalf("max age %s after EnsureDeadLetter(1h)", got)
	}
	if err := queue.Ensure(ctx, js); err != nil { // a front door starting later keeps the worker's setting
		t.Fatal(err)
	}
	if got := maxAge(); got != time.Hour {
		t.Fatalf("max age %s after Ensure", got)
	}
}

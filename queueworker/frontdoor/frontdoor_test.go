package frontdoor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

type fakeFunctions map[string]functions.Function

func (f fakeFunctions) Function(_ context.Context, name string) (functions.Function, error) {
	if fn, ok := f[name]; ok {
		return fn, nil
	}
	return functions.Function{}, functions.ErrUnknownFunction
}

func setup(t *testing.T, cfg frontdoor.Config) (*httptest.Server, jetstream.JetStream) {
	t.Helper()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	if err := frontdoor.EnsureStreams(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	cfg.JetStream = js
	srv := httptest.NewServer(frontdoor.New(cfg))
	t.Cleanup(srv.Close)
	return srv, js
}

// next reads the next message of a queue's stream with a throwaway consumer.
func next(t *testing.T, js jetstream.JetStream, q string) (types.QueueRequest, jetstream.Msg) {
	t.Helper()
	ctx := context.Background()
	c, err := js.CreateOrUpdateConsumer(ctx, queue.Stream(q), jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatalf("no message on %s: %v", queue.Stream(q), err)
	}
	if err := msg.Ack(); err != nil {
		t.Fatal(err)
	}
	var req types.QueueRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		t.Fatalf("message is not a QueueRequest: %v: %s", err, msg.Data())
	}
	return req, msg
}

func TestPublishesQueueRequest(t *testing.T) {
	now := time.Unix(1700000000, 123)
	srv, js := setup(t, frontdoor.Config{Now: func() time.Time { return now }})
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/async-function/echo/sub/path?x=1&y=2", strings.NewReader("hello"))
	req.Header.Set("X-Callback-Url", "http://127.0.0.1:1/cb")
	req.Header.Set("Content-Type", "text/plain")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202", res.StatusCode)
	}
	id := res.Header.Get("X-Call-Id")
	if len(id) != 36 {
		t.Fatalf("X-Call-Id %q is not a UUID", id)
	}
	if got := res.Header.Get("X-Start-Time"); got != "1700000000000000123" {
		t.Fatalf("X-Start-Time %q", got)
	}
	qr, msg := next(t, js, queue.DefaultQueue)
	if msg.Subject() != "faas-request" {
		t.Fatalf("subject %q", msg.Subject())
	}
	if qr.Function != "echo" || qr.Method != http.MethodPut || qr.Path != "/sub/path" || qr.QueryString != "x=1&y=2" ||
		string(qr.Body) != "hello" || qr.QueueName != queue.DefaultQueue {
		t.Fatalf("queue request %+v", qr)
	}
	if qr.CallbackURL == nil || qr.CallbackURL.String() != "http://127.0.0.1:1/cb" {
		t.Fatalf("callback %v", qr.CallbackURL)
	}
	if qr.Header.Get("X-Call-Id") != id || qr.Header.Get("Content-Type") != "text/plain" || qr.Header.Get("X-Start-Time") == "" {
		t.Fatalf("headers %v", qr.Header)
	}
	if msg.Headers().Get(jetstream.MsgIDHeader) != id {
		t.Fatalf("Nats-Msg-Id %q, want the call ID", msg.Headers().Get(jetstream.MsgIDHeader))
	}
}

func TestKeepsClientCallIDAndDeduplicates(t *testing.T) {
	srv, js := setup(t, frontdoor.Config{})
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/async-function/echo", strings.NewReader("a"))
		req.Header.Set("X-Call-Id", "my-call")
		req.Header.Set("X-Start-Time", "42")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 202 || res.Header.Get("X-Call-Id") != "my-call" || res.Header.Get("X-Start-Time") != "42" {
			t.Fatalf("status %d, headers %v", res.StatusCode, res.Header)
		}
	}
	st, err := js.Stream(context.Background(), queue.Stream(queue.DefaultQueue))
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("stream holds %d messages for one call ID sent twice, want 1", n)
	}
}

func TestRejects(t *testing.T) {
	srv, _ := setup(t, frontdoor.Config{MaxBodyBytes: 10, Functions: fakeFunctions{"echo": {Name: "echo", Queue: queue.DefaultQueue}}})
	for _, tc := range []struct {
		name, path, body, callback string
		status                     int
		mention                    string
	}{
		{"too large", "/async-function/echo", strings.Repeat("x", 11), "", 413, "limit of 10 bytes"},
		{"bad callback", "/async-function/echo", "x", "not a url", 400, "X-Callback-Url"},
		{"relative callback", "/async-function/echo", "x", "/cb", 400, "X-Callback-Url"},
		{"unknown function", "/async-function/nope", "x", "", 404, "nope"},
		{"bad function name", "/async-function/a..b", "x", "", 400, "function name"},
		{"unknown namespace", "/async-function/echo.prod", "x", "", 404, `"echo.prod"`},
		// A request that climbs out of the function's path, and other spellings of a climb.
		{"double-encoded climb", "/async-function/echo/%252e%252e/%252e%252e/system/functions", "x", "", 400, "climbs out"},
		{"triple-encoded climb", "/async-function/echo/%25252e%25252e/system/functions", "x", "", 400, "climbs out"},
		{"encoded backslash", "/async-function/echo/..%255csystem", "x", "", 400, "backslash"},
		{"callback to the gateway", "/async-function/echo", "x", "SELF/system/functions", 400, "points at this gateway"},
		{"callback to the gateway by another name", "/async-function/echo", "x", "LOCALHOST/system/functions", 400, "points at this gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			cb := strings.Replace(tc.callback, "SELF", srv.URL, 1)
			cb = strings.Replace(cb, "LOCALHOST", strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), 1)
			if cb != "" {
				req.Header.Set("X-Callback-Url", cb)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var b strings.Builder
			_, _ = readAll(&b, res)
			if res.StatusCode != tc.status || !strings.Contains(b.String(), tc.mention) {
				t.Fatalf("status %d body %q, want %d mentioning %q", res.StatusCode, b.String(), tc.status, tc.mention)
			}
		})
	}
}

func TestNamedQueueGetsItsStream(t *testing.T) {
	srv, js := setup(t, frontdoor.Config{Functions: fakeFunctions{"slow": {Name: "slow", Queue: "slow-queue"}}})
	res, err := http.Post(srv.URL+"/async-function/slow", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 202 {
		t.Fatalf("status %d", res.StatusCode)
	}
	qr, msg := next(t, js, "slow-queue")
	if qr.QueueName != "slow-queue" || msg.Subject() != "slow-queue" {
		t.Fatalf("queue %q subject %q", qr.QueueName, msg.Subject())
	}
}

func readAll(b *strings.Builder, res *http.Response) (int64, error) { return io.Copy(b, res.Body) }

// faas-cli's `invoke --async` posts to /async-function/<name>.<namespace>: the function is looked
// up in that namespace, and the queue request names it as the client did (as the CE gateway does).
func TestNameDotNamespace(t *testing.T) {
	srv, js := setup(t, frontdoor.Config{Functions: fakeFunctions{
		"echo.openfaas-fn": {Name: "echo", Queue: queue.DefaultQueue},
	}})
	res, err := http.Post(srv.URL+"/async-function/echo.openfaas-fn", "text/plain", strings.NewReader("hi"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202", res.StatusCode)
	}
	qr, _ := next(t, js, queue.DefaultQueue)
	if qr.Function != "echo.openfaas-fn" || string(qr.Body) != "hi" {
		t.Fatalf("queue request %+v", qr)
	}
}

func TestMethodsOfTheProxyOnly(t *testing.T) {
	srv, _ := setup(t, frontdoor.Config{})
	for _, m := range []string{"CONNECT", "TRACE", "PROPFIND"} {
		req, _ := http.NewRequest(m, srv.URL+"/async-function/echo", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: status %d, want 405", m, res.StatusCode)
		}
	}
}

// One body limit, 4 MiB, end to end: a body of exactly the limit is queued (with large headers
// beside it) on a server with the embedded server's max_payload; one byte more is 413 naming the limit.
func TestBodyLimitIsTheQueueLimit(t *testing.T) {
	srv, js := setup(t, frontdoor.Config{MaxBodyBytes: 64 << 20}) // more than the queue carries: lowered
	post := func(n int, header string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/async-function/echo", bytes.NewReader(bytes.Repeat([]byte{'<'}, n)))
		req.Header.Set("X-Big", header)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if status, body := post(queue.MaxBodyBytes+1, ""); status != http.StatusRequestEntityTooLarge ||
		!strings.Contains(body, "limit of 4194304 bytes (4 MiB)") {
		t.Fatalf("a body one byte over the limit: %d %q, want 413 naming 4194304 bytes (4 MiB)", status, body)
	}
	// 900 KB of header that JSON would escape ('<' as \u003c would make it six times larger).
	if status, body := post(queue.MaxBodyBytes, strings.Repeat("<\"", 300_000)); status != http.StatusAccepted {
		t.Fatalf("a body of exactly the limit: %d %q, want 202", status, body)
	}
	qr, msg := next(t, js, queue.DefaultQueue)
	if len(qr.Body) != queue.MaxBodyBytes || len(msg.Data()) > queue.MaxMessageBytes {
		t.Fatalf("queued body %d bytes in a message of %d bytes (limit %d)", len(qr.Body), len(msg.Data()), queue.MaxMessageBytes)
	}
}

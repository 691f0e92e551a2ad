package frontdoor_test

import (
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
	msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
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
		{"too large", "/async-function/echo", strings.Repeat("x", 11), "", 413, "10 bytes"},
		{"bad callback", "/async-function/echo", "x", "not a url", 400, "X-Callback-Url"},
		{"relative callback", "/async-function/echo", "x", "/cb", 400, "X-Callback-Url"},
		{"unknown function", "/async-function/nope", "x", "", 404, "nope"},
		{"bad function name", "/async-function/a..b", "x", "", 400, "function name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			if tc.callback != "" {
				req.Header.Set("X-Callback-Url", tc.callback)
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

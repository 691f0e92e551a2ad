package worker_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestDeadLetterFloodStaysWithinItsLimit: async calls whose callbacks all fail, with bodies of 256 KiB, are
// dead-lettered with their bodies; after 60 of them (15 MiB) the dead-letter stream holds at most its limit
// (8 MiB here), the newest entries kept, and the queue is drained.
func TestDeadLetterFloodStaysWithinItsLimit(t *testing.T) {
	e := newEnv(t, echo)
	e.cbStatus.Store(http.StatusInternalServerError)
	const limit = queue.MaxMessageBytes // the smallest the worker accepts: one message of the largest size
	e.run(worker.Config{DeadLetterMaxBytes: limit,
		CallbackRetry: worker.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	body := strings.Repeat("x", 256<<10)
	var last string
	for i := 0; i < 60; i++ {
		last = e.send("/async-function/echo", body, nil)
	}
	testkit.Eventually(t, 30*time.Second, "the last call's dead letter", func() bool {
		for _, m := range e.deadLetters() {
			if m.Header.Get(queue.HeaderCallID) == last {
				return true
			}
		}
		return false
	})
	info := streamInfo(t, e.js, queue.DeadLetterStream)
	if info.Config.MaxBytes != limit || info.State.Bytes > limit {
		t.Errorf("dead letters: %d bytes with max bytes %d, want at most %d", info.State.Bytes, info.Config.MaxBytes, limit)
	}
	if info.State.Msgs >= 60 {
		t.Errorf("dead letters: all %d kept, want the oldest dropped", info.State.Msgs)
	}
	t.Logf("60 dead letters of 256 KiB: the stream holds %d (%d bytes, limit %d)", info.State.Msgs, info.State.Bytes, limit)
	testkit.Eventually(t, 10*time.Second, "queue drained", func() bool { return e.streamMsgs(queue.DefaultQueue) == 0 })
}

// TestFullQueueAnswers429: once a queue's backlog reaches its limit (no worker runs), the front door refuses the
// next call with 429 and Retry-After instead of accepting it, and no call already accepted is dropped.
func TestFullQueueAnswers429(t *testing.T) {
	e := newEnv(t, echo)
	ctx := context.Background()
	if err := queue.ApplyLimits(ctx, e.js, queue.Limits{QueueMaxBytes: 1 << 20}, queue.DefaultQueue); err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("y", 64<<10)
	accepted, refused := 0, 0
	for i := 0; i < 40 && refused == 0; i++ {
		req, _ := http.NewRequest(http.MethodPost, e.front.URL+"/async-function/echo", strings.NewReader(body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		switch res.StatusCode {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			refused++
			if res.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
		default:
			t.Fatalf("call %d: %d", i, res.StatusCode)
		}
	}
	if refused == 0 || accepted == 0 {
		t.Fatalf("accepted %d, refused %d: want some accepted, then 429", accepted, refused)
	}
	info := streamInfo(t, e.js, queue.Stream(queue.DefaultQueue))
	if info.State.Msgs != uint64(accepted) || info.Config.Discard != jetstream.DiscardNew {
		t.Errorf("queue holds %d of %d accepted calls (discard %v)", info.State.Msgs, accepted, info.Config.Discard)
	}
}

// TestApplyLimitsBoundsStreamsFromBefore: streams created without limits (an older faas-gpu, or by hand) get the
// defaults when the worker starts; an explicit setting replaces a stream's value.
func TestApplyLimitsBoundsStreamsFromBefore(t *testing.T) {
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	ctx := context.Background()
	old := queue.StreamConfig(queue.DefaultQueue)
	old.MaxBytes, old.MaxAge, old.Discard = -1, 0, jetstream.DiscardOld
	dl := queue.DeadLetterStreamConfig(0)
	dl.MaxBytes = -1
	for _, cfg := range []jetstream.StreamConfig{old, dl} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := queue.ApplyLimits(ctx, js, queue.Limits{}, queue.DefaultQueue); err != nil {
		t.Fatal(err)
	}
	q, d := streamInfo(t, js, queue.Stream(queue.DefaultQueue)).Config, streamInfo(t, js, queue.DeadLetterStream).Config
	if q.MaxBytes != queue.DefaultQueueMaxBytes || q.Discard != jetstream.DiscardNew || d.MaxBytes != queue.DefaultDeadLetterMaxBytes {
		t.Errorf("after ApplyLimits: queue max bytes %d discard %v, dead letters max bytes %d", q.MaxBytes, q.Discard, d.MaxBytes)
	}
	if err := queue.ApplyLimits(ctx, js, queue.Limits{QueueMaxAge: time.Hour, DeadLetterMaxBytes: 64 << 20,
		DeadLetterMaxAge: 2 * time.Hour}, queue.DefaultQueue); err != nil {
		t.Fatal(err)
	}
	q, d = streamInfo(t, js, queue.Stream(queue.DefaultQueue)).Config, streamInfo(t, js, queue.DeadLetterStream).Config
	if q.MaxAge != time.Hour || d.MaxBytes != 64<<20 || d.MaxAge != 2*time.Hour {
		t.Errorf("explicit limits: queue max age %s, dead letters %d bytes %s", q.MaxAge, d.MaxBytes, d.MaxAge)
	}
	if _, err := worker.New(worker.Config{JetStream: js, GatewayURL: "http://127.0.0.1:1", QueueMaxBytes: 1024}); err == nil ||
		!strings.Contains(err.Error(), "QueueMaxBytes") {
		t.Errorf("a queue limit below one message: %v, want an error naming QueueMaxBytes", err)
	}
}

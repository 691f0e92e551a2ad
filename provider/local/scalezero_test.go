package local

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestScaleFromZero: requests to a function at 0 replicas wake it, as the OpenFaaS gateway's scale-from-zero does:
// eight concurrent first calls start one replica between them, wait for it and are answered; the new count is
// recorded (a restarted backend starts it again). A function deployed with com.openfaas.scale.min=0 wakes with 1.
func TestScaleFromZero(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fd := probe("probe")
	fd.Labels = &map[string]string{LabelScaleMin: "0"}
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Status(ctx, "", "probe"); err != nil || st.Replicas != 0 || len(b.pids("probe")) != 0 {
		t.Fatalf("deployed at scale.min 0: %+v %v, pids %v", st, err, b.pids("probe"))
	}

	for round := range 2 { // deployed at 0; then scaled to 0 after serving
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, out, err := routeInvoke(ctx, b, "probe", "/")
				if err == nil && code != http.StatusOK {
					err = &httpError{code, string(out)}
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: a first call at 0 replicas: %v", round, err)
			}
		}
		b.mu.Lock()
		started := b.fns["probe"].started
		b.mu.Unlock()
		if started != round+1 {
			t.Fatalf("round %d: %d replicas started in all, want %d: concurrent first calls start one replica",
				round, started, round+1)
		}
		st, err := b.Status(ctx, "", "probe")
		if err != nil || st.Replicas != 1 || st.AvailableReplicas != 1 {
			t.Fatalf("round %d: after scale from zero: %+v %v", round, st, err)
		}
		if !strings.Contains(logText(t, b, "probe"), "scaled from zero to 1 by a request") {
			t.Fatalf("round %d: the function's log does not say it was scaled from zero:\n%s", round,
				logText(t, b, "probe"))
		}
		if err := b.Scale(ctx, "", "probe", 0); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 60*time.Second, "the replica to stop", func() bool { return len(b.pids("probe")) == 0 })
	}

	// The woken count is recorded: a backend restarted after a wake-up starts the function.
	if _, _, err := b.Route(ctx, "", "probe"); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := e.open(t)
	if st, err := b2.Status(ctx, "", "probe"); err != nil || st.Replicas != 1 {
		t.Fatalf("after a restart: %+v %v, want 1 replica recorded", st, err)
	}
}

// TestScaleFromZeroWaitsOnlyUntilTheDeadline: a woken function that is not ready before the caller's deadline (the
// proxy's ready timeout) answers ErrNotReady wrapping the deadline; its replica keeps starting.
func TestScaleFromZeroWaitsOnlyUntilTheDeadline(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	fd := probe("probe")
	fd.Labels = &map[string]string{LabelScaleMin: "0"}
	if err := b.Deploy(context.Background(), fd); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	_, _, err := b.Route(ctx, "", "probe")
	if !isErr(err, provider.ErrNotReady) || !isErr(err, context.DeadlineExceeded) {
		t.Fatalf("Route after its deadline = %v, want ErrNotReady wrapping the deadline", err)
	}
	if st, err := b.Status(context.Background(), "", "probe"); err != nil || st.Replicas != 1 {
		t.Fatalf("status: %+v %v, want 1 replica starting", st, err)
	}
	waitReady(t, b, "probe", 1)
}

type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string { return http.StatusText(e.code) + ": " + e.body }

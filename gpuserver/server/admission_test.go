package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestAdmissionRuleThroughTheAPI: the gpuserver runs the deadline admission rule by default. On one GPU, with a
// function whose requests hold the GPU for about 400 ms (learnt from a first request) and a deadline of 500 ms, a
// request arriving while another holds the GPU is predicted to finish after about 800 ms: the API answers 429
// with a Retry-After (whole seconds, at least the predicted miss), the client maps it to pool.ErrOverloaded, and
// a retry after that time, the GPU free again, is admitted. With -admission none the same request waits instead.
func TestAdmissionRuleThroughTheAPI(t *testing.T) {
	const hold, slo = 400 * time.Millisecond, 500 * time.Millisecond
	for _, tc := range []struct {
		name      string
		admission controller.Admission
		refused   bool
	}{{"default", "", true}, {"none", controller.AdmissionNone, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := startOneGPU(ctx, t, Config{Admission: tc.admission})
			defer stop(t, s)
			admin := client.New(s.Socket(), client.WithToken(s.AdminToken()))
			tok, err := admin.RegisterToken(ctx, pool.FunctionSpec{Name: "bert", MemoryBytes: 64 << 20, SLO: slo})
			if err != nil {
				t.Fatal(err)
			}
			c := client.New(s.Socket(), client.WithToken(tok))
			serve := func() { // one request that holds the GPU for hold
				t.Helper()
				b, err := c.Acquire(ctx, "bert", 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(hold) // the request's work on the GPU: what the controller learns its cost from
				if err := c.Release(ctx, b.ID); err != nil {
					t.Fatal(err)
				}
			}
			serve()
			held, err := c.Acquire(ctx, "bert", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", s.Socket())
			}}}
			req, _ := http.NewRequest(http.MethodPost, "http://gpuserver/v1/functions/bert/acquire",
				strings.NewReader(`{"timeout_ms": 5000}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			if !tc.refused {
				go func() { // the waiting request is bound once the held one is released
					time.Sleep(100 * time.Millisecond)
					_ = c.Release(ctx, held.ID)
				}()
			}
			start := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if !tc.refused {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("without the rule: status %d after %v, want 200 once the GPU is free", resp.StatusCode,
						time.Since(start))
				}
				return
			}
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("status %d, Retry-After %q; want 429 and 1 (the predicted miss, about 300 ms, rounded up)",
					resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			_, err = c.Acquire(ctx, "bert", 5*time.Second)
			var oe *pool.OverloadedError
			if !errors.Is(err, pool.ErrOverloaded) || !errors.As(err, &oe) || oe.RetryAfter != time.Second ||
				!strings.Contains(err.Error(), "deadline") {
				t.Fatalf("client: %v, want an OverloadedError of the deadline rule retrying after 1s", err)
			}
			serveDone := time.Now()
			if err := c.Release(ctx, held.ID); err != nil { // the held request's work ends
				t.Fatal(err)
			}
			time.Sleep(time.Until(serveDone.Add(oe.RetryAfter)))
			b, err := c.Acquire(ctx, "bert", 5*time.Second)
			if err != nil {
				t.Fatalf("retry after Retry-After: %v", err)
			}
			if err := c.Release(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
			if st := s.Pool().Status(ctx); len(st.Functions) != 1 || st.Functions[0].Refused != 2 {
				t.Fatalf("pool status %+v, want 2 of bert's requests refused", st.Functions)
			}
		})
	}
}

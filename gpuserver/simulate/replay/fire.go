package replay

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
)

// Record is one request's fate as the client saw it.
type Record struct {
	Function int
	// At is the arrival's offset in the window; Lag how much later than that the request was sent (the client's
	// own delay on a loaded machine).
	At, Lag time.Duration
	// Latency is from sending the request to the end of its answer.
	Latency time.Duration
	// Status is the HTTP status of the answer; 0 when none came (Err says why: the request is lost).
	Status int
	Err    string
}

// Refused reports whether the node refused the request: 429 (the overload control or the admission rule, with
// Retry-After) or 503 (no capacity).
func (r Record) Refused() bool {
	return r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable
}

// Fire sends each arrival as POST <gateway>/function/<name> at its offset from now times timeScale (the timed
// virtual GPU's: a window replayed in slow motion), open loop (every request on its own, whatever the ones before
// it are doing), and waits for every answer; each request may take up to timeout. The records are in the
// arrivals' order, their times in the window's time (divided by timeScale). When ctx ends, the requests not yet
// sent are recorded as lost with ctx's error.
func Fire(ctx context.Context, client *http.Client, gateway string, fns []Function, arrivals []simulate.Arrival,
	timeScale float64, timeout time.Duration) []Record {
	recs := make([]Record, len(arrivals))
	start := time.Now()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i, a := range arrivals {
		recs[i] = Record{Function: a.Function, At: a.At}
		at := time.Duration(float64(a.At) * timeScale)
		if d := time.Until(start.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if err := ctx.Err(); err != nil {
			recs[i].Err = err.Error()
			continue
		}
		recs[i].Lag = time.Duration(float64(max(0, time.Since(start)-at)) / timeScale)
		wg.Add(1)
		go func(r *Record, name string) {
			defer wg.Done()
			send(ctx, client, gateway+"/function/"+name, timeout, r)
			r.Latency = time.Duration(float64(r.Latency) / timeScale)
		}(&recs[i], fns[a.Function].Name)
	}
	wg.Wait()
	return recs
}

// send makes one request and fills r with its latency and status.
func send(ctx context.Context, client *http.Client, url string, timeout time.Duration, r *Record) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		r.Err = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			r.Status = resp.StatusCode // an answer counts once it was read whole
		}
	}
	r.Latency = time.Since(sent)
	if err != nil {
		r.Err = err.Error()
	}
}

// Client is an HTTP client for Fire: as many connections to the gateway as requests in flight, none idle for
// long.
func Client() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost, t.IdleConnTimeout = 1024, 1024, 30*time.Second
	return &http.Client{Transport: t}
}

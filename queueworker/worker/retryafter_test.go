package worker

import (
	"net/http"
	"testing"
	"time"
)

// TestRetryAfter: a 429 or 503 with Retry-After in seconds or as an HTTP date delays the retry at least that
// long (capped); other statuses and bad values do not.
func TestRetryAfter(t *testing.T) {
	h := func(v string) http.Header { return http.Header{"Retry-After": []string{v}} }
	for _, c := range []struct {
		status int
		h      http.Header
		want   time.Duration
		ok     bool
	}{
		{429, h("2"), 2 * time.Second, true},
		{503, h("0"), 0, true},
		{429, h("100000"), maxRetryAfter, true},
		{500, h("2"), 0, false},
		{429, nil, 0, false},
		{429, h("soon"), 0, false},
	} {
		got, ok := retryAfter(c.status, c.h)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%d, %v) = %v, %v; want %v, %v", c.status, c.h, got, ok, c.want, c.ok)
		}
	}
	if d, ok := retryAfter(429, h(time.Now().Add(time.Minute).UTC().Format(http.TimeFormat))); !ok ||
		d < 58*time.Second || d > time.Minute {
		t.Errorf("HTTP date a minute ahead: %v, %v", d, ok)
	}
}

package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
)

// UsageSource is the functions' bill (package metering's Meter).
type UsageSource interface {
	Report(since time.Time) metering.Report
}

// WithUsage serves GET /v1/usage[?since=T] from u: the bill per function since T (RFC 3339, or a duration back
// from now such as 24h; rounded down to the hour), or since it began. It is read-only, and scoped as /v1/pool: the
// administrator sees every function's bill, a function's token its namespace's (scope.go).
func WithUsage(u UsageSource) Option { return func(s *Server) { s.usage = u } }

// ParseSince reads a since value: RFC 3339 or a positive duration back from now; "" is the zero time.
func ParseSince(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a positive "+
			"duration back from now (24h, 90m)", v)
	}
	return now.Add(-d), nil
}

func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	sc, err := s.readerScope(r, "reading the functions' bill")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	since, err := ParseSince(r.URL.Query().Get("since"), time.Now())
	if err != nil {
		s.fail(w, r, fmt.Errorf("%w: %w", errInvalidBody, err))
		return
	}
	writeJSON(w, http.StatusOK, scopeReport(s.usage.Report(since), sc))
}

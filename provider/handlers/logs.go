package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/openfaas/faas-provider/logs"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// MakeLogsHandler answers GET /system/logs?name=&namespace=&instance=&tail=&since=&follow= with the function's
// output as faas-provider log messages, one JSON object per line (application/x-ndjson), flushed as they come.
// follow streams until the client goes away. A bad parameter answers 400 naming it; an unknown function 404.
func MakeLogsHandler(src provider.LogSource, b provider.Backend, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if src == nil {
			notImplemented(w, r)
			return
		}
		req, err := parseLogRequest(r)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if req.Namespace, err = namespace(r.Context(), b, req.Namespace); err != nil {
			writeError(w, log, r, err)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		msgs, err := src.Logs(ctx, req)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		enc := json.NewEncoder(w)
		for m := range msgs {
			if err := enc.Encode(m); err != nil {
				break // the client went away
			}
			if err := rc.Flush(); err != nil {
				break
			}
		}
		cancel()
		for range msgs { // the source closes the channel once ctx ends
		}
	}
}

func parseLogRequest(r *http.Request) (logs.Request, error) {
	q := r.URL.Query()
	req := logs.Request{Name: q.Get("name"), Namespace: q.Get("namespace"), Instance: q.Get("instance")}
	if err := names.Function("name", req.Name); err != nil {
		return req, err
	}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return req, fmt.Errorf("%w: tail %q is not an integer", provider.ErrInvalid, v)
		}
		req.Tail = n
	}
	if v := q.Get("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return req, fmt.Errorf("%w: follow %q is not true or false", provider.ErrInvalid, v)
		}
		req.Follow = f
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return req, fmt.Errorf("%w: since %q is not an RFC 3339 time", provider.ErrInvalid, v)
		}
		req.Since = &t
	}
	return req, nil
}

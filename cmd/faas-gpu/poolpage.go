package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/auth"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/ui"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// poolPage is the live page of a gpuserver's pool (package gpuserver/ui): its pool, bill and metrics, and the
// asynchronous queues of js when there is one. The caller puts it behind credentials and closes it.
func poolPage(gs *server.Server, node string, js jetstream.JetStream, log *slog.Logger) (*ui.UI, error) {
	cfg := ui.Config{Pool: gs.Pool(), Usage: usageOf{gs}, Metrics: gs.Metrics(), Node: node,
		Logger: log.With("component", "ui")}
	if js != nil {
		cfg.Queues = func(ctx context.Context) ([]ui.QueueRow, uint64, error) {
			states, dead, err := queue.States(ctx, js)
			if err != nil {
				return nil, 0, err
			}
			rows := make([]ui.QueueRow, 0, len(states))
			for _, s := range states {
				rows = append(rows, ui.QueueRow{Queue: s.Queue, Messages: s.Messages, Pending: s.Pending,
					InWorker: s.AckPending, Redelivered: s.Redelivered, Consumers: s.Consumers})
			}
			return rows, dead, nil
		}
	}
	return ui.New(cfg)
}

// usageOf is a gpuserver's bill as the page reads it.
type usageOf struct{ gs *server.Server }

func (u usageOf) Report(since time.Time) metering.Report { return u.gs.Usage(since) }

// Bounds of the gpuserver's pool page listener: connections in all and per peer.
const (
	poolPageMaxConns   = 64
	poolPageMaxPerPeer = 16
)

// servePoolPage serves the pool page of a gpuserver on addr behind basic auth (`faas-gpu gpuserver -ui-addr`) and
// returns what stops it.
func servePoolPage(ctx context.Context, gs *server.Server, node, addr string, creds *auth.BasicAuthCredentials,
	stdout io.Writer, log *slog.Logger) (func(context.Context) error, error) {
	page, err := poolPage(gs, node, nil, log)
	if err != nil {
		return nil, err
	}
	// Its viewers are few: a small fixed bound, as the queue worker's metrics (in a cluster the chart may admit
	// every peer to this port).
	l, err := boundedListen("tcp", addr, "ui",
		connlimit.Limits{MaxConns: poolPageMaxConns, MaxPerPeer: poolPageMaxPerPeer}, log)
	if err != nil {
		page.Close()
		return nil, usageError{fmt.Errorf("-ui-addr %s: %w", addr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/ui", auth.DecorateWithBasicAuth(page.ServeHTTP, creds))
	mux.Handle("/ui/", auth.DecorateWithBasicAuth(page.ServeHTTP, creds))
	hs := newHTTPServer(mux)
	go func() {
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pool page stopped", "err", err)
		}
	}()
	fmt.Fprintf(stdout, "gpuserver: pool page on http://%s/ui (basic auth: user %s)\n", l.Addr(), creds.User)
	return func(ctx context.Context) error {
		defer page.Close()
		if err := hs.Shutdown(ctx); err != nil {
			return errors.Join(err, hs.Close())
		}
		return nil
	}, nil
}

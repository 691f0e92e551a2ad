package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// The asynchronous path of `faas-gpu up`: the embedded NATS JetStream server (with credentials created at first
// start), the front door and the queue worker.

// Files in the state dir.
const (
	// natsURLFile holds the embedded NATS server's URL, credentials included (mode 0600), for `faas-gpu pool`.
	natsURLFile = "nats-url"
	// natsSecretsDir (mode 0700) holds credentials created at first start.
	natsSecretsDir = "secrets"
	// natsUserFile and natsPasswordFile, in natsSecretsDir (mode 0600), are the NATS credentials.
	natsUserFile     = "nats-user"
	natsPasswordFile = "nats-password"
	// natsUser is the user name `up` creates.
	natsUser = "faas-gpu"
)

// upQueueConfig holds the flags of `faas-gpu up` for the asynchronous path.
type upQueueConfig struct {
	deadLetterAge  time.Duration
	deadLetterDrop bool
	limits         streamLimitFlags
}

func (c *upQueueConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&c.deadLetterAge, "dead-letter-max-age", queue.DefaultDeadLetterMaxAge,
		"how long dead-letter entries (the request without credentials, with its body) are kept")
	fs.BoolVar(&c.deadLetterDrop, "dead-letter-drop-bodies", false, "keep request bodies out of dead-letter entries")
	c.limits.register(fs)
}

// validate checks the flags: the streams' settings by the worker's rules (worker.Config.ValidateStreams; the rest
// of up's worker config is up's own, made at start).
func (c *upQueueConfig) validate() error {
	if err := c.limits.validate(); err != nil {
		return err
	}
	wcfg := worker.Config{DeadLetterMaxAge: c.deadLetterAge}
	c.limits.apply(&wcfg)
	if err := wcfg.ValidateStreams(); err != nil {
		return workerFlagError(err)
	}
	return nil
}

// natsCredentials returns the NATS user and password kept in <stateDir>/secrets, creating them (a random
// password, files of mode 0600 in a folder of mode 0700) at first start. A folder or file another user could read
// is made private again.
func natsCredentials(stateDir string) (user, password string, err error) {
	dir := filepath.Join(stateDir, natsSecretsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("secrets: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("secrets: %w", err)
	}
	user, err = natsSecretFile(filepath.Join(dir, natsUserFile), func() string { return natsUser })
	if err != nil {
		return "", "", err
	}
	password, err = natsSecretFile(filepath.Join(dir, natsPasswordFile), natsserver.RandomPassword)
	if err != nil {
		return "", "", err
	}
	return user, password, nil
}

// natsSecretFile reads a secret file (mode 0600), or creates it with gen's value when missing.
func natsSecretFile(path string, gen func() string) (string, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		v := gen()
		if err := writeFilePrivate(path, []byte(v+"\n")); err != nil {
			return "", fmt.Errorf("secrets: %w", err)
		}
		return v, nil
	}
	if err != nil {
		return "", fmt.Errorf("secrets: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return "", fmt.Errorf("secrets: %w", err)
	}
	v := strings.TrimSpace(string(raw))
	if v == "" {
		return "", fmt.Errorf("secrets: %s is empty (delete it to have a new one made)", path)
	}
	return v, nil
}

// writeFilePrivate writes a file of mode 0600 whole: a temporary file renamed over path, so that a reader never sees
// it half written and an older file's wider mode does not survive.
func writeFilePrivate(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// startNATS starts the embedded NATS JetStream server (store in <stateDir>/jetstream, credentials required),
// connects to it, creates the default queue's and the dead letters' streams, and writes the nats-url file.
func (u *up) startNATS(ctx context.Context, host string, port int, stateDir string) (*natsserver.Server, jetstream.JetStream, error) {
	user, password, err := natsCredentials(stateDir)
	if err != nil {
		return nil, nil, err
	}
	ns, err := natsserver.Start(ctx, natsserver.Config{StoreDir: filepath.Join(stateDir, "jetstream"),
		Host: host, Port: port, Username: user, Password: password,
		MaxConns: connlimit.Budget(connlimit.NoFile(), 0.1, natsserver.DefaultMaxConns).MaxConns})
	if err != nil {
		return nil, nil, fmt.Errorf("nats: %w", err)
	}
	u.onStop(func(context.Context) error { ns.Shutdown(); return nil })
	nlog := u.log.With("component", "nats-client")
	// Through memory, not TCP: up's own connection takes no descriptor and never waits behind the listener, so a
	// connection storm on the NATS port (or on any of up's surfaces) cannot cut the queues off.
	nc, err := nats.Connect(ns.ClientURL(), nats.InProcessServer(ns), nats.UserInfo(user, password),
		nats.Name("faas-gpu up"), nats.MaxReconnects(-1), nats.IgnoreAuthErrorAbort(),
		// A disconnect or close while up stops is the shutdown, not a fault: said at debug level only.
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if ctx.Err() != nil || err == nil {
				nlog.Debug("disconnected", "err", err)
				return
			}
			nlog.Warn("disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) { nlog.Info("reconnected") }),
		nats.ClosedHandler(func(c *nats.Conn) {
			if ctx.Err() != nil {
				nlog.Debug("connection closed", "err", c.LastError())
				return
			}
			nlog.Error("connection closed", "err", c.LastError())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { nlog.Warn("async error", "err", err) }))
	if err != nil {
		return nil, nil, fmt.Errorf("nats connect: %w", err)
	}
	u.onStop(func(context.Context) error { nc.Close(); return nil })
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := frontdoor.EnsureStreams(ctx, js); err != nil {
		return nil, nil, fmt.Errorf("jetstream streams: %w", err)
	}
	withAuth, err := url.Parse(ns.ClientURL())
	if err != nil {
		return nil, nil, fmt.Errorf("nats: client URL: %w", err)
	}
	withAuth.User = url.UserPassword(user, password)
	if err := writeFilePrivate(filepath.Join(stateDir, natsURLFile), []byte(withAuth.String()+"\n")); err != nil {
		return nil, nil, fmt.Errorf("state dir: %w", err)
	}
	return ns, js, nil
}

// queueFunctions is what the front door and the worker look functions up in: the backend itself, in-process
// (no HTTP round trip, no credentials for /system/functions), read again on every miss so that a call right
// after a deploy finds its function.
func queueFunctions(backend functions.Catalog) *functions.Cache {
	return functions.NewCache(functions.CacheConfig{Catalog: backend, MissRefresh: -1, DefaultNamespace: provider.DefaultNamespace})
}

// queueFrontDoor is the handler of /async-function/.
func queueFrontDoor(js jetstream.JetStream, fns functions.Source, log *slog.Logger) http.Handler {
	return frontdoor.New(frontdoor.Config{JetStream: js, Functions: fns, Logger: log.With("component", "frontdoor")})
}

// startQueueWorker runs the queue worker until up stops; forbidden are addresses callbacks may not reach beside
// the gateway's.
func (u *up) startQueueWorker(ctx context.Context, cfg upQueueConfig, wcfg worker.Config, metrics prometheus.Registerer) error {
	wcfg.Registerer = metrics
	// Calls still running after this are given back to JetStream for redelivery; up stops within 5s.
	wcfg.DrainTimeout = 3 * time.Second
	wcfg.Logger = u.log.With("component", "queue-worker")
	wcfg.DeadLetterMaxAge = cfg.deadLetterAge
	wcfg.DeadLetterDropBodies = cfg.deadLetterDrop
	cfg.limits.apply(&wcfg)
	w, err := worker.New(wcfg)
	if err != nil {
		return fmt.Errorf("queue worker: %w", err)
	}
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		if err := w.Run(wctx); err != nil {
			u.runErrs <- fmt.Errorf("queue worker: %w", err)
		}
	}()
	u.onStop(func(ctx context.Context) error {
		wcancel()
		select {
		case <-wdone:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("queue worker did not drain: %w", ctx.Err())
		}
	})
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/faas-gpu/faas-gpu/connlimit"
	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// queueWorkerConfig holds the flags of `faas-gpu queue-worker`; each has an environment variable (envName).
type queueWorkerConfig struct {
	natsURL         string
	natsUser        string
	natsPassFile    string
	gatewayURL      string
	functionsURL    string
	authUser        string
	authPassFile    string
	gpuserverSocket string
	gpuserverURL    string
	gpuserverKey    string
	durable         string
	queues          string
	order           string
	maxInflight     int
	lookahead       int
	ackWait         time.Duration
	maxAttempts     int
	retryInitial    time.Duration
	retryMax        time.Duration
	invokeTimeout   time.Duration
	callbackTimeout time.Duration
	drainTimeout    time.Duration
	unknownGrace    time.Duration
	metricsAddr     string
	frontdoorAddr   string
	logLevel        string
	deadLetterAge   time.Duration
	deadLetterDrop  bool
	forbidCallbacks string
	limits          streamLimitFlags
	conns           connFlags
}

func (c *queueWorkerConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server with JetStream")
	fs.StringVar(&c.natsUser, "nats-user", "faas-gpu", "NATS user (with -nats-password-file)")
	fs.StringVar(&c.natsPassFile, "nats-password-file", "", "file holding the NATS password (a mounted secret); none: connect without credentials")
	fs.StringVar(&c.gatewayURL, "gateway-url", "http://127.0.0.1:8080", "gateway (or provider) that functions are invoked through")
	fs.StringVar(&c.functionsURL, "functions-url", "", "where GET /system/functions is read for SLO and queue annotations; default -gateway-url")
	fs.StringVar(&c.authUser, "basic-auth-user", "", "basic auth user for /system/functions (the OpenFaaS gateway protects /system/*)")
	fs.StringVar(&c.authPassFile, "basic-auth-password-file", "", "file holding the basic auth password (as OpenFaaS mounts its secret)")
	fs.StringVar(&c.gpuserverSocket, "gpuserver-socket", "", "gpuserver API socket: admit GPU functions by the pool's capacity")
	fs.StringVar(&c.gpuserverURL, "gpuserver-url", "", "gpuserver API over TCP (instead of -gpuserver-socket)")
	fs.StringVar(&c.gpuserverKey, "gpuserver-key-file", "", "the gpuserver's key file (its -key-file): the pool's "+
		"status is read with the administrator's credential derived from it (the gpuserver answers 401 without one)")
	fs.StringVar(&c.durable, "durable", "faas-gpu-queue-worker", "durable consumer name; workers with the same name share the work")
	fs.StringVar(&c.queues, "queues", queue.DefaultQueue, "comma-separated queues to consume (stream OF_<queue> each)")
	fs.StringVar(&c.order, "order", string(worker.OrderSLOAware), "dispatch order: slo-aware or fifo (also dqls, torpor)")
	fs.IntVar(&c.maxInflight, "max-inflight", 0, "concurrent invocations; 0 sizes it to the GPU pool (at least 16)")
	fs.IntVar(&c.lookahead, "lookahead", 0, "messages held for ordering beyond max-inflight; 0 means 4 x max-inflight (at least 1024)")
	fs.DurationVar(&c.ackWait, "ack-wait", 30*time.Second, "JetStream ack wait; held messages get in-progress acks every third of it")
	fs.IntVar(&c.maxAttempts, "max-attempts", 5, "invocation attempts per message, the first included (retries on 408, 429, 500, 502-504)")
	fs.DurationVar(&c.retryInitial, "retry-initial", 250*time.Millisecond, "backoff after the first failed attempt; doubles each retry")
	fs.DurationVar(&c.retryMax, "retry-max", 30*time.Second, "largest backoff between attempts")
	fs.DurationVar(&c.invokeTimeout, "invoke-timeout", 5*time.Minute, "timeout of one invocation")
	fs.DurationVar(&c.callbackTimeout, "callback-timeout", 30*time.Second, "timeout of one callback attempt")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "how long running invocations may finish at shutdown")
	fs.DurationVar(&c.unknownGrace, "unknown-grace", 10*time.Second, "how long a call to a function not (yet) listed is retried before it is dead-lettered; negative: at once")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address at /metrics, e.g. 127.0.0.1:8082")
	fs.StringVar(&c.frontdoorAddr, "frontdoor-addr", "",
		"also serve the async front door (POST /async-function/{name}) on this address, e.g. :8081, for clusters whose gateway does not publish to JetStream itself")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.deadLetterAge, "dead-letter-max-age", queue.DefaultDeadLetterMaxAge,
		"how long dead-letter entries (the request without credentials, with its body) are kept")
	fs.BoolVar(&c.deadLetterDrop, "dead-letter-drop-bodies", false, "keep request bodies out of dead-letter entries")
	c.limits.register(fs)
	c.conns.register(fs)
	fs.StringVar(&c.forbidCallbacks, "forbidden-callback-hosts", "",
		"comma-separated host:port that callbacks may never reach, beside the gateway's, -functions-url's and -gpuserver-url's (e.g. the provider's)")
}

// validate checks the flags; errors name the flag and are usage errors. The worker's own settings are checked by
// the worker (worker.Config.Validate, the one place that knows them); the rest here.
func (c *queueWorkerConfig) validate() error {
	bad := func(flagName, format string, args ...any) error {
		return usageError{fmt.Errorf("-%s: %s", flagName, fmt.Sprintf(format, args...))}
	}
	if err := c.workerConfig().Validate(); err != nil {
		return workerFlagError(err)
	}
	if c.functionsURL != "" {
		if u, err := url.Parse(c.functionsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("functions-url", "%q is not an http(s) URL", c.functionsURL)
		}
	}
	if (c.authUser == "") != (c.authPassFile == "") {
		return bad("basic-auth-password-file", "give -basic-auth-user and -basic-auth-password-file together")
	}
	if c.gpuserverURL != "" {
		if u, err := url.Parse(c.gpuserverURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("gpuserver-url", "%q is not an http(s) URL", c.gpuserverURL)
		}
		if c.gpuserverSocket != "" {
			return bad("gpuserver-url", "give either -gpuserver-socket or -gpuserver-url, not both")
		}
	}
	if c.natsUser == "" && c.natsPassFile != "" {
		return bad("nats-user", "must not be empty with -nats-password-file")
	}
	if c.frontdoorAddr != "" {
		if _, _, err := net.SplitHostPort(c.frontdoorAddr); err != nil {
			return bad("frontdoor-addr", "%q is not host:port", c.frontdoorAddr)
		}
	}
	if err := c.limits.validate(); err != nil {
		return err
	}
	if err := c.conns.validate(); err != nil {
		return err
	}
	if c.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.metricsAddr); err != nil {
			return bad("metrics-addr", "%q is not host:port", c.metricsAddr)
		}
	}
	return nil
}

func (c *queueWorkerConfig) queueList() []string { return splitList(c.queues) }

// workerConfig is the worker's config the flags give (without the credentials, read from files at start, and
// the parts a running worker needs: its function source, metrics, logger and the gpuserver client).
func (c *queueWorkerConfig) workerConfig() worker.Config {
	wcfg := worker.Config{
		NATSURL:         c.natsURL,
		Durable:         c.durable,
		Queues:          c.queueList(),
		GatewayURL:      c.gatewayURL,
		MaxInflight:     c.maxInflight,
		Lookahead:       c.lookahead,
		AckWait:         c.ackWait,
		Retry:           worker.RetryPolicy{MaxAttempts: c.maxAttempts, InitialBackoff: c.retryInitial, MaxBackoff: c.retryMax},
		InvokeTimeout:   c.invokeTimeout,
		CallbackTimeout: c.callbackTimeout,
		DrainTimeout:    c.drainTimeout,
		UnknownGrace:    c.unknownGrace,
		Order:           worker.Ordering(c.order),

		ForbiddenCallbackHosts: c.forbiddenCallbackHosts(),
		DeadLetterMaxAge:       c.deadLetterAge,
		DeadLetterDropBodies:   c.deadLetterDrop,
	}
	c.limits.apply(&wcfg)
	return wcfg
}

// workerFlagError is a worker's configuration error (worker.ConfigError) as a usage error naming the flag that set
// the field at fault.
func workerFlagError(err error) error {
	var ce *worker.ConfigError
	if !errors.As(err, &ce) {
		return usageError{err}
	}
	flagName := map[string]string{
		"NATSURL": "nats-url", "Durable": "durable", "Queues": "queues", "GatewayURL": "gateway-url",
		"MaxInflight": "max-inflight", "Lookahead": "lookahead", "AckWait": "ack-wait",
		"Retry.MaxAttempts": "max-attempts", "Retry.InitialBackoff": "retry-initial", "Retry.MaxBackoff": "retry-max",
		"InvokeTimeout": "invoke-timeout", "CallbackTimeout": "callback-timeout", "DrainTimeout": "drain-timeout",
		"Order": "order", "ForbiddenCallbackHosts": "forbidden-callback-hosts", "DeadLetterMaxAge": "dead-letter-max-age",
		"QueueMaxBytes": "queue-max-bytes", "DeadLetterMaxBytes": "dead-letter-max-bytes",
	}[ce.Field]
	if flagName == "" {
		return usageError{err}
	}
	return usageError{fmt.Errorf("-%s: %w", flagName, err)}
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, q := range strings.Split(s, ",") {
		if q = strings.TrimSpace(q); q != "" {
			out = append(out, q)
		}
	}
	return out
}

// forbiddenCallbackHosts are the flag's hosts, -functions-url's and -gpuserver-url's (the gateway's the worker adds
// itself).
func (c *queueWorkerConfig) forbiddenCallbackHosts() []string {
	out := splitList(c.forbidCallbacks)
	for _, raw := range []string{c.functionsURL, c.gpuserverURL} {
		if raw == "" {
			continue
		}
		if u, err := url.Parse(raw); err == nil {
			port := u.Port()
			if port == "" {
				port = map[bool]string{true: "443", false: "80"}[u.Scheme == "https"]
			}
			out = append(out, net.JoinHostPort(u.Hostname(), port))
		}
	}
	return out
}

// natsAuth is the NATS credentials of the flags (none without -nats-password-file).
type natsAuth struct{ user, password string }

func (a natsAuth) options() []nats.Option {
	if a.password == "" {
		return nil
	}
	return []nats.Option{nats.UserInfo(a.user, a.password)}
}

func runQueueWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg queueWorkerConfig
	fs := flag.NewFlagSet("queue-worker", flag.ContinueOnError)
	cfg.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg.logLevel)
	if err != nil {
		return err
	}
	fnCfg := functions.GatewayConfig{URL: cfg.gatewayURL, Username: cfg.authUser}
	if cfg.functionsURL != "" {
		fnCfg.URL = cfg.functionsURL
	}
	if cfg.authPassFile != "" {
		pw, err := os.ReadFile(cfg.authPassFile)
		if err != nil {
			return usageError{fmt.Errorf("-basic-auth-password-file: %w", err)}
		}
		fnCfg.Password = strings.TrimSpace(string(pw))
	}
	var auth natsAuth
	if cfg.natsPassFile != "" {
		pw, err := os.ReadFile(cfg.natsPassFile)
		if err != nil {
			return usageError{fmt.Errorf("-nats-password-file: %w", err)}
		}
		if auth = (natsAuth{user: cfg.natsUser, password: strings.TrimSpace(string(pw))}); auth.password == "" {
			return usageError{fmt.Errorf("-nats-password-file: %s is empty", cfg.natsPassFile)}
		}
	}
	reg := prometheus.NewRegistry()
	wcfg := cfg.workerConfig()
	wcfg.NATSUser, wcfg.NATSPassword = auth.user, auth.password
	wcfg.Functions = functions.NewGateway(fnCfg)
	wcfg.Registerer, wcfg.Logger = reg, log
	var gsToken string
	if cfg.gpuserverKey != "" {
		key, err := gpuauth.ReadKey(cfg.gpuserverKey)
		if err != nil {
			return usageError{fmt.Errorf("-gpuserver-key-file: %w", err)}
		}
		gsToken = key.AdminToken()
	} else if cfg.gpuserverSocket != "" || cfg.gpuserverURL != "" {
		log.Warn("no -gpuserver-key-file: the gpuserver's pool status takes a credential, GPU dispatch is not " +
			"limited by its capacity")
	}
	switch {
	case cfg.gpuserverSocket != "":
		wcfg.Capacity = client.New(cfg.gpuserverSocket, client.WithToken(gsToken))
	case cfg.gpuserverURL != "":
		wcfg.Capacity = client.NewTCP(cfg.gpuserverURL, client.WithToken(gsToken))
	}
	w, err := worker.New(wcfg)
	if err != nil {
		return err
	}
	var metricsSrv *http.Server
	metricsErr := make(chan error, 1)
	if cfg.metricsAddr != "" {
		// Scrapers are few: a small fixed bound.
		ln, err := boundedListen("tcp", cfg.metricsAddr, "metrics", connlimit.Limits{MaxConns: 64, MaxPerPeer: 16}, log)
		if err != nil {
			return fmt.Errorf("-metrics-addr %s: %w", cfg.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { metricsErr <- metricsSrv.Serve(ln) }()
		fmt.Fprintf(stdout, "queue-worker: metrics on http://%s/metrics\n", ln.Addr())
	}
	if cfg.frontdoorAddr != "" {
		stop, err := serveFrontDoor(ctx, cfg.frontdoorAddr, cfg.natsURL, auth, wcfg.Functions, cfg.conns.limits(0.5), log, stdout)
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintf(stdout, "queue-worker: consuming %s from %s, invoking through %s, order %s\n",
		strings.Join(wcfg.Queues, ","), redactedURL(cfg.natsURL), cfg.gatewayURL, cfg.order)
	err = w.Run(ctx)
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if serr := metricsSrv.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("metrics server shutdown: %w", serr)
		}
		if serr := <-metricsErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = fmt.Errorf("metrics server: %w", serr)
		}
	}
	return err
}

// serveFrontDoor serves POST /async-function/{name} on addr, publishing to the queues on natsURL; stop shuts it
// down under a deadline.
func serveFrontDoor(ctx context.Context, addr, natsURL string, auth natsAuth, fns functions.Source,
	limits connlimit.Limits, log *slog.Logger, stdout io.Writer) (stop func(), err error) {
	nc, err := nats.Connect(natsURL, append(auth.options(), nats.Name("faas-gpu front door"), nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, fmt.Errorf("front door: nats %s: %w", redactedURL(natsURL), err)
	}
	if nc.MaxPayload() < queue.MaxMessageBytes {
		log.Warn("the NATS server's max_payload is below what the asynchronous path needs: large calls will get 413",
			"max_payload", nc.MaxPayload(), "needed", queue.MaxMessageBytes)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("front door: %w", err)
	}
	if err := frontdoor.EnsureStreams(ctx, js); err != nil {
		nc.Close()
		return nil, fmt.Errorf("front door: %w", err)
	}
	ln, err := boundedListen("tcp", addr, "front door", limits, log)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("-frontdoor-addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: checkCallbackHeader(frontdoor.New(frontdoor.Config{JetStream: js, Functions: fns,
		Logger: log.With("component", "frontdoor")})), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:    time.Minute, // a body trickled in slower than 4 MiB a minute is cut off
		MaxHeaderBytes: 1 << 20}     // with a 4 MiB body, the largest queue request that fits queue.MaxMessageBytes
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("front door stopped", "err", err)
		}
	}()
	fmt.Fprintf(stdout, "queue-worker: async front door on http://%s/async-function/{name}\n", ln.Addr())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("front door shutdown", "err", err)
		}
		nc.Close()
	}, nil
}

// redactedURL hides the password of a URL that carries one.
func redactedURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

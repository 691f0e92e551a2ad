// Package handlers serves the faas-provider v0.25.12 HTTP API (the routes of faas-provider's bootstrap.Serve, on
// the same paths and methods) on top of a provider.Backend, with one MakeXHandler constructor per verb as faasd
// does. GPU functions (com.openfaas.gpu.* annotations) are validated at deploy and update and registered with the
// node's gpuserver through a provider.GPURegistry.
package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/faas-gpu/faas-gpu/provider"
)

// NameExpression is the character class of a function name in routes (faas-provider's).
const NameExpression = "-a-zA-Z_0-9."

// maxBody bounds the JSON bodies of /system requests.
const maxBody = 1 << 20

// Config is what the handlers depend on.
type Config struct {
	// Backend runs functions; required.
	Backend provider.Backend
	// Secrets keeps secrets; nil answers /system/secrets with 501.
	Secrets provider.SecretStore
	// Logs streams function output; nil answers /system/logs with 501.
	Logs provider.LogSource
	// Namespaces keeps the namespaces (faas-cli namespace create/get/update/delete); nil takes the Backend when it
	// is a provider.NamespaceStore, else /system/namespace/{name} answers 501.
	Namespaces provider.NamespaceStore
	// GPU is the node's gpuserver; nil means none (GPU functions are still validated and deployed).
	GPU provider.GPURegistry
	// Info is answered on /system/info.
	Info types.ProviderInfo
	// Auth, when set, protects every /system/* route with HTTP basic auth (faas-provider's auth package, as
	// faas-netes does). /function/*, /healthz and /metrics stay open, as in OpenFaaS.
	Auth *auth.BasicAuthCredentials
	// ProxyTimeout bounds one proxied invocation; 0 means no limit beyond the client's.
	ProxyTimeout time.Duration
	// ReadyTimeout bounds how long an invocation waits for a replica of a function whose replicas are starting
	// (the first call after a deploy); 0 means 30s, negative means no wait.
	ReadyTimeout time.Duration
	// BodyIdleTimeout bounds the wait for each read of a request body (slow clients); 0 means 30s, negative none.
	// /system bodies must also arrive whole within SystemBodyTimeout (0: 60s), invocation bodies within
	// ProxyTimeout.
	BodyIdleTimeout, SystemBodyTimeout time.Duration
	// GatewayMetrics registers the OpenFaaS gateway's gateway_function_invocation_total on Metrics: set it when
	// these handlers are the gateway (faas-gpu up), not behind one.
	GatewayMetrics bool
	// InvocationsFile keeps the invocation counts (InvocationCount, faas-cli list) across restarts; "" keeps them
	// in memory only.
	InvocationsFile string
	// Logger receives request failures; default discards.
	Logger *slog.Logger
	// Metrics is the registry /metrics serves and the handlers' request metrics go to; default a new one.
	Metrics *prometheus.Registry
}

// DefaultReadyTimeout is how long an invocation waits for a starting function by default.
const DefaultReadyTimeout = 30 * time.Second

// New returns a handler serving every faas-provider route on a router of its own.
func New(cfg Config) http.Handler {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	idle, systemTotal := cfg.BodyIdleTimeout, cfg.SystemBodyTimeout
	if idle == 0 {
		idle = 30 * time.Second
	}
	if systemTotal <= 0 {
		systemTotal = 60 * time.Second
	}
	m := newMetrics(reg)
	inv := newInvocations(reg, cfg.GatewayMetrics, cfg.InvocationsFile, log)
	r := mux.NewRouter()
	name := "{name:[" + NameExpression + "]+}"

	// system wraps a /system handler: request metrics, body time limits, JSON bodies only (strict for deploys),
	// then basic auth outermost, so that nothing is read from an unauthenticated client.
	system := func(h http.Handler, pathLabel string, strictJSON bool) http.HandlerFunc {
		h = m.instrument(requireJSON(strictJSON, LimitBodyTime(BodyTimeouts{Idle: idle, Total: systemTotal}, h)), pathLabel)
		if cfg.Auth != nil {
			return auth.DecorateWithBasicAuth(h.ServeHTTP, cfg.Auth)
		}
		return h.ServeHTTP
	}
	r.HandleFunc("/system/functions", system(MakeListHandler(cfg.Backend, inv, log), "", false)).Methods(http.MethodGet)
	r.HandleFunc("/system/functions", system(MakeDeployHandler(cfg.Backend, cfg.GPU, log), "", true)).Methods(http.MethodPost)
	r.HandleFunc("/system/functions", system(MakeDeleteHandler(cfg.Backend, cfg.GPU, inv, log), "", false)).Methods(http.MethodDelete)
	r.HandleFunc("/system/functions", system(MakeUpdateHandler(cfg.Backend, cfg.GPU, log), "", true)).Methods(http.MethodPut)
	r.HandleFunc("/system/function/"+name, system(MakeStatusHandler(cfg.Backend, inv, log), "/system/function", false)).
		Methods(http.MethodGet)
	r.HandleFunc("/system/scale-function/"+name, system(MakeScaleHandler(cfg.Backend, log), "/system/scale-function", false)).
		Methods(http.MethodPost)
	r.HandleFunc("/system/info", system(MakeInfoHandler(cfg.Info), "", false)).Methods(http.MethodGet)
	r.HandleFunc("/system/secrets", system(MakeSecretsHandler(cfg.Secrets, cfg.Backend, log), "", false)).
		Methods(http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete)
	r.HandleFunc("/system/logs", system(MakeLogsHandler(cfg.Logs, cfg.Backend, log), "", false)).Methods(http.MethodGet)
	r.HandleFunc("/system/namespaces", system(MakeNamespacesHandler(cfg.Backend, log), "", false)).Methods(http.MethodGet)
	nsStore := cfg.Namespaces
	if nsStore == nil {
		nsStore, _ = cfg.Backend.(provider.NamespaceStore)
	}
	r.HandleFunc("/system/namespace/{name:["+NameExpression+"]*}",
		system(MakeNamespaceHandler(nsStore, log), "/system/namespace", false)).
		Methods(http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete)

	proxy := LimitBodyTime(BodyTimeouts{Idle: idle, Total: cfg.ProxyTimeout},
		makeProxy(proxyConfig{backend: cfg.Backend, timeout: cfg.ProxyTimeout, readyTimeout: cfg.ReadyTimeout,
			invocations: inv, log: log}))
	r.Handle("/function/"+name, proxy)
	r.Handle("/function/"+name+"/", proxy)
	r.Handle("/function/"+name+"/{params:.*}", proxy)

	r.HandleFunc("/healthz", MakeHealthHandler()).Methods(http.MethodGet, http.MethodHead)
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return r
}

func notImplemented(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "Feature not implemented in this version of OpenFaaS", http.StatusNotImplemented)
}

// writeError answers with the status provider.StatusCode gives for err and err's message as plain text (what
// faas-cli prints).
func writeError(w http.ResponseWriter, log *slog.Logger, r *http.Request, err error) {
	code := provider.StatusCode(err)
	if code >= 500 {
		log.Error("provider request failed", "method", r.Method, "path", r.URL.Path, "status", code, "err", err)
	}
	http.Error(w, err.Error(), code)
}

// decodeJSON reads a JSON request body into v; a malformed body is provider.ErrInvalid.
func decodeJSON(r *http.Request, v any) error {
	if r.Body == nil {
		return fmt.Errorf("%w: request body is empty; want JSON", provider.ErrInvalid)
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case err == io.EOF:
			return fmt.Errorf("%w: request body is empty; want JSON", provider.ErrInvalid)
		case errors.As(err, &tooLarge):
			return fmt.Errorf("%w: the body is over %d bytes", provider.ErrTooLarge, maxBody)
		case errors.Is(err, provider.ErrSlowClient):
			return fmt.Errorf("reading the request body: %w", err)
		}
		return fmt.Errorf("%w: request body is not valid JSON: %v", provider.ErrInvalid, err)
	}
	return nil
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

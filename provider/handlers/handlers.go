// Package handlers serves the faas-provider v0.25.12 HTTP API (the routes of faas-provider's bootstrap.Serve, on
// the same paths and methods) on top of a provider.Backend, with one MakeXHandler constructor per verb as faasd
// does. GPU functions (com.openfaas.gpu.* annotations) are validated at deploy and update and registered with the
// node's gpuserver through a provider.GPURegistry.
package handlers

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gorilla/mux"
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
	// GPU is the node's gpuserver; nil means none (GPU functions are still validated and deployed).
	GPU provider.GPURegistry
	// Info is answered on /system/info.
	Info types.ProviderInfo
	// ProxyTimeout bounds one proxied invocation; 0 means no limit beyond the client's.
	ProxyTimeout time.Duration
	// Logger receives request failures; default discards.
	Logger *slog.Logger
	// Metrics is the registry /metrics serves and the handlers' request metrics go to; default a new one.
	Metrics *prometheus.Registry
}

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
	m := newMetrics(reg)
	r := mux.NewRouter()
	name := "{name:[" + NameExpression + "]+}"

	r.HandleFunc("/system/functions", m.instrument(MakeListHandler(cfg.Backend, log), "")).Methods(http.MethodGet)
	r.HandleFunc("/system/functions", m.instrument(MakeDeployHandler(cfg.Backend, cfg.GPU, log), "")).Methods(http.MethodPost)
	r.HandleFunc("/system/functions", m.instrument(MakeDeleteHandler(cfg.Backend, cfg.GPU, log), "")).Methods(http.MethodDelete)
	r.HandleFunc("/system/functions", m.instrument(MakeUpdateHandler(cfg.Backend, cfg.GPU, log), "")).Methods(http.MethodPut)
	r.HandleFunc("/system/function/"+name, m.instrument(MakeStatusHandler(cfg.Backend, log), "/system/function")).
		Methods(http.MethodGet)
	r.HandleFunc("/system/scale-function/"+name, m.instrument(MakeScaleHandler(cfg.Backend, log), "/system/scale-function")).
		Methods(http.MethodPost)
	r.HandleFunc("/system/info", m.instrument(MakeInfoHandler(cfg.Info), "")).Methods(http.MethodGet)
	r.HandleFunc("/system/secrets", m.instrument(MakeSecretsHandler(cfg.Secrets, cfg.Backend, log), "")).
		Methods(http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete)
	r.HandleFunc("/system/logs", m.instrument(MakeLogsHandler(cfg.Logs, cfg.Backend, log), "")).Methods(http.MethodGet)
	r.HandleFunc("/system/namespaces", m.instrument(MakeNamespacesHandler(cfg.Backend, log), "")).Methods(http.MethodGet)
	r.HandleFunc("/system/namespace/{name:["+NameExpression+"]*}", m.instrument(http.HandlerFunc(notImplemented), "")).
		Methods(http.MethodGet)

	proxy := MakeProxyHandler(cfg.Backend, cfg.ProxyTimeout, log)
	r.HandleFunc("/function/"+name, proxy)
	r.HandleFunc("/function/"+name+"/", proxy)
	r.HandleFunc("/function/"+name+"/{params:.*}", proxy)

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
		if err == io.EOF {
			return fmt.Errorf("%w: request body is empty; want JSON", provider.ErrInvalid)
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

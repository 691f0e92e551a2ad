package handlers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/faas-gpu/faas-gpu/provider"
)

// InternalHeader tags answers the proxy generates itself, so that they can be told apart from a function's own
// (faas-provider's X-OpenFaaS-Internal).
const InternalHeader = "X-OpenFaaS-Internal"

// proxyConfig is what the proxy needs of Config.
type proxyConfig struct {
	backend      provider.Backend
	timeout      time.Duration // one invocation; 0: no limit beyond the client's
	readyTimeout time.Duration // waiting for a ready replica; <0: no wait
	invocations  *invocations
	log          *slog.Logger
}

// makeProxy answers /function/{name}[.{namespace}][/{params}] by forwarding the request to a ready replica,
// with faas-provider's semantics: the path after the name and the query are forwarded, headers are copied (plus
// X-Forwarded-For/Host/Proto), bodies stream both ways, and a response without Content-Type gets the request's or
// text/plain. While the function's replicas are starting (the first call after a deploy, a restart) the request
// waits up to readyTimeout for one, as the OpenFaaS gateway's scale-from-zero does. The proxy's own errors carry
// InternalHeader: 404 for an unknown function, 503 when no replica is ready in time, 502 when the replica cannot be
// reached, 504 after timeout (0: no limit), 408 when the client sends its body too slowly. Every invocation of a
// known function is counted (InvocationCount, the gateway's invocation metric).
func makeProxy(pc proxyConfig) http.HandlerFunc {
	b, timeout, log := pc.backend, pc.timeout, pc.log
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       5 * time.Second,
		ExpectContinueTimeout: 1500 * time.Millisecond,
	}
	return func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions,
			http.MethodHead:
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		vars := mux.Vars(r)
		name, ns := vars["name"], ""
		if i := strings.IndexByte(name, '.'); i >= 0 {
			name, ns = name[:i], name[i+1:]
		}
		internal := func(code int, format string, args ...any) {
			w.Header().Set(InternalHeader, "proxy")
			http.Error(w, fmt.Sprintf(format, args...), code)
		}
		ns, err := namespace(r.Context(), b, ns)
		if err != nil {
			internal(provider.StatusCode(err), "%v", err)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		w = sw
		base, done, err := route(r.Context(), b, ns, name, pc.readyTimeout)
		if err != nil {
			code := provider.StatusCode(err)
			if code >= 500 && code != http.StatusServiceUnavailable {
				log.Error("resolving function failed", "function", name, "err", err)
			}
			switch {
			case errors.Is(err, provider.ErrNotFound):
				internal(code, "function %s not found in namespace %s", name, ns)
				return // not an invocation of a function
			case errors.Is(err, provider.ErrNotReady):
				internal(code, "No endpoints available for: %s. (%v)", name, err)
			default:
				internal(code, "resolving %s: %v", name, err)
			}
			pc.invocations.add(name, ns, sw.status)
			return
		}
		defer func() { pc.invocations.add(name, ns, sw.status) }()
		defer done()
		ctx := r.Context()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		params := vars["params"]
		rp := &httputil.ReverseProxy{
			Transport:     transport,
			FlushInterval: -1, // stream: flush every write
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme = base.Scheme
				pr.Out.URL.Host = base.Host
				pr.Out.URL.Path = "/" + params
				pr.Out.URL.RawPath = ""
				pr.Out.URL.RawQuery = pr.In.URL.RawQuery
				pr.Out.Host = ""
				pr.SetXForwarded()
			},
			ModifyResponse: func(resp *http.Response) error {
				if resp.Header.Get("Content-Type") == "" {
					ct := r.Header.Get("Content-Type")
					if ct == "" {
						ct = "text/plain"
					}
					resp.Header.Set("Content-Type", ct)
				}
				return nil
			},
			ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
				w.Header().Set(InternalHeader, "proxy")
				switch {
				case errors.Is(err, provider.ErrSlowClient) || slowClient(r.Body):
					// The connection's read deadline also cancels the request, so the error may be either.
					http.Error(w, fmt.Sprintf("function %s: %v", name, provider.ErrSlowClient), http.StatusRequestTimeout)
				case errors.Is(err, context.DeadlineExceeded):
					http.Error(w, fmt.Sprintf("function %s did not answer within %s", name, timeout), http.StatusGatewayTimeout)
				case errors.Is(err, context.Canceled):
					// The client went away; nobody reads the answer.
					w.WriteHeader(http.StatusBadGateway)
				default:
					log.Warn("proxying to function failed", "function", name, "err", err)
					http.Error(w, fmt.Sprintf("Can't reach service for: %s.", name), http.StatusBadGateway)
				}
			},
		}
		rp.ServeHTTP(w, r.WithContext(ctx))
	}
}

// route finds a ready replica for one request. A provider.Router waits for readiness itself; for other backends
// Resolve is polled while the function has replicas desired. Either way the wait ends after readyTimeout (<0: no
// wait). done is called when the request has ended.
func route(ctx context.Context, b provider.Backend, ns, name string, readyTimeout time.Duration) (*url.URL, func(), error) {
	if readyTimeout < 0 {
		readyTimeout = 0
	}
	wctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if rt, ok := b.(provider.Router); ok {
		return rt.Route(wctx, ns, name)
	}
	delay := 20 * time.Millisecond
	for {
		u, err := b.Resolve(ctx, ns, name)
		if err == nil {
			return u, func() {}, nil
		}
		if !errors.Is(err, provider.ErrNotReady) {
			return nil, nil, err
		}
		if st, serr := b.Status(ctx, ns, name); serr != nil || st.Replicas == 0 {
			return nil, nil, err // scaled to zero (the gateway scales from zero before it proxies)
		}
		t := time.NewTimer(delay)
		select {
		case <-wctx.Done():
			t.Stop()
			return nil, nil, fmt.Errorf("%w (waited %s)", err, readyTimeout)
		case <-t.C:
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

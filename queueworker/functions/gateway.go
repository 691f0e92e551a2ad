package functions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/types"
)

// GatewayConfig configures a Gateway source.
type GatewayConfig struct {
	// URL is the gateway's (or provider's) base URL; the source reads <URL>/system/functions[?namespace=] and
	// <URL>/system/namespaces.
	URL string
	// Client makes the requests; nil means a client with a 10s timeout that follows no redirect.
	Client *http.Client
	// TTL, MissRefresh and Now: see CacheConfig.
	TTL, MissRefresh time.Duration
	Now              func() time.Time
	// Username and Password, when Username is set, authenticate the listing with HTTP basic auth (the OpenFaaS
	// gateway protects /system/*). They are sent to URL only, never to functions or callbacks.
	Username, Password string
}

// Gateway is a Catalog over the gateway's HTTP API.
type Gateway struct {
	cfg GatewayConfig
}

// NewGateway returns a cached Source and Lister over the gateway's GET /system/functions and /system/namespaces.
func NewGateway(cfg GatewayConfig) *Cache {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	return NewCache(CacheConfig{Catalog: &Gateway{cfg: cfg}, TTL: cfg.TTL, MissRefresh: cfg.MissRefresh, Now: cfg.Now})
}

// List reads GET /system/functions[?namespace=ns]. A namespaced listing the gateway refuses with 400 or 404
// is ErrUnknownNamespace.
func (g *Gateway) List(ctx context.Context, ns string) ([]types.FunctionStatus, error) {
	u := g.cfg.URL + "/system/functions"
	if ns != "" {
		u += "?namespace=" + url.QueryEscape(ns)
	}
	var list []types.FunctionStatus
	status, err := g.get(ctx, u, &list)
	if ns != "" && (status == http.StatusBadRequest || status == http.StatusNotFound) {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnknownNamespace, ns, err)
	}
	return list, err
}

// Namespaces reads GET /system/namespaces.
func (g *Gateway) Namespaces(ctx context.Context) ([]string, error) {
	var list []string
	_, err := g.get(ctx, g.cfg.URL+"/system/namespaces", &list)
	return list, err
}

// get reads a JSON document; it returns the HTTP status (0 when there was none) and an error for anything but 200.
func (g *Gateway) get(ctx context.Context, u string, into any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("functions: request %s: %w", u, err)
	}
	if g.cfg.Username != "" {
		req.SetBasicAuth(g.cfg.Username, g.cfg.Password)
	}
	res, err := g.cfg.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("functions: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return res.StatusCode, fmt.Errorf("functions: GET %s: %s: %s", req.URL.Path, res.Status, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 64<<20)).Decode(into); err != nil {
		return res.StatusCode, fmt.Errorf("functions: GET %s: decode: %w", req.URL.Path, err)
	}
	return res.StatusCode, nil
}

// IsUnknown reports whether err says the function does not exist.
func IsUnknown(err error) bool { return errors.Is(err, ErrUnknownFunction) }

package functions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"
)

// GatewayConfig configures a Gateway source.
type GatewayConfig struct {
	// URL is the gateway's (or provider's) base URL; the source reads <URL>/system/functions.
	URL string
	// Client makes the requests; nil means a client with a 10s timeout.
	Client *http.Client
	// TTL is how long a listing is used before it is read again; 0 means 5s.
	TTL time.Duration
	// MissRefresh is the least time between two reads caused by a name missing from the listing, so that a
	// stream of calls to an unknown function does not hammer the provider; 0 means 1s.
	MissRefresh time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Username and Password, when Username is set, authenticate the listing with HTTP basic auth (the OpenFaaS
	// gateway protects /system/*).
	Username, Password string
}

// Gateway is a Source and Lister over the provider's GET /system/functions, cached.
type Gateway struct {
	cfg GatewayConfig

	mu        sync.Mutex
	byName    map[string]Function
	fetchedAt time.Time
}

// NewGateway returns a Gateway source.
func NewGateway(cfg GatewayConfig) *Gateway {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 5 * time.Second
	}
	if cfg.MissRefresh <= 0 {
		cfg.MissRefresh = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	return &Gateway{cfg: cfg}
}

// Function returns the named function from the cached listing, reading the listing again when it is older than
// the TTL, or when the name is missing and the last read is older than MissRefresh. When the provider cannot be
// read, a cached entry is used however old; without one the error is returned (not ErrUnknownFunction: the
// caller should retry later).
func (g *Gateway) Function(ctx context.Context, name string) (Function, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.cfg.Now()
	f, ok := g.byName[name]
	age := now.Sub(g.fetchedAt)
	if g.byName != nil && (ok && age < g.cfg.TTL || !ok && age < g.cfg.MissRefresh) {
		if ok {
			return f, nil
		}
		return Function{}, fmt.Errorf("%w: %s", ErrUnknownFunction, name)
	}
	if err := g.refreshLocked(ctx); err != nil {
		if ok {
			return f, nil
		}
		return Function{}, err
	}
	if f, ok := g.byName[name]; ok {
		return f, nil
	}
	return Function{}, fmt.Errorf("%w: %s", ErrUnknownFunction, name)
}

// Functions lists every function, from the cache when it is fresh.
func (g *Gateway) Functions(ctx context.Context) ([]Function, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byName == nil || g.cfg.Now().Sub(g.fetchedAt) >= g.cfg.TTL {
		if err := g.refreshLocked(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]Function, 0, len(g.byName))
	for _, f := range g.byName {
		out = append(out, f)
	}
	return out, nil
}

func (g *Gateway) refreshLocked(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.cfg.URL+"/system/functions", nil)
	if err != nil {
		return fmt.Errorf("functions: list request: %w", err)
	}
	if g.cfg.Username != "" {
		req.SetBasicAuth(g.cfg.Username, g.cfg.Password)
	}
	res, err := g.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("functions: list: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("functions: list: %s: %s", res.Status, strings.TrimSpace(string(msg)))
	}
	var list []types.FunctionStatus
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		return fmt.Errorf("functions: list: decode: %w", err)
	}
	byName := make(map[string]Function, len(list))
	for _, st := range list {
		var ann map[string]string
		if st.Annotations != nil {
			ann = *st.Annotations
		}
		byName[st.Name] = FromAnnotations(st.Name, ann)
	}
	g.byName = byName
	g.fetchedAt = g.cfg.Now()
	return nil
}

// IsUnknown reports whether err says the function does not exist.
func IsUnknown(err error) bool { return errors.Is(err, ErrUnknownFunction) }

package functions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// Catalog is where functions are read from: the provider's backend (provider.Backend satisfies it) or, over
// HTTP, the gateway (Gateway).
type Catalog interface {
	// List returns every function of a namespace; "" means the default namespace.
	List(ctx context.Context, namespace string) ([]types.FunctionStatus, error)
	// Namespaces lists the namespaces functions may live in.
	Namespaces(ctx context.Context) ([]string, error)
}

// ErrUnknownNamespace may be returned (wrapped) by a Catalog's List for a namespace that does not exist; a Cache
// reports a function in it as unknown.
var ErrUnknownNamespace = errors.New("unknown namespace")

// CacheConfig configures a Cache.
type CacheConfig struct {
	// Catalog is read; required.
	Catalog Catalog
	// TTL is how long a namespace's listing is used before it is read again; 0 means 5s.
	TTL time.Duration
	// MissRefresh is the least time between two reads of a namespace caused by a name missing from its listing,
	// so that a stream of calls to an unknown function does not hammer the provider; 0 means 1s, negative reads
	// again on every miss (for a catalog in this process, so that a function deployed a moment ago is found).
	MissRefresh time.Duration
	// DefaultNamespace is the name of the namespace "" stands for, when known; otherwise it is learnt from the
	// default listing.
	DefaultNamespace string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Cache is a Source and Lister over a Catalog, caching each namespace's listing.
type Cache struct {
	cfg CacheConfig

	mu        sync.Mutex
	listings  map[string]*listing // by namespace as asked ("" is the default namespace)
	defaultNS string              // the default namespace's name, once a listing of it showed one
	nsList    []string            // Catalog.Namespaces, as last read
	nsAt      time.Time
	nsErr     error
}

type listing struct {
	byName    map[string]Function // by plain name
	fetchedAt time.Time
}

// NewCache returns a Cache over cfg.Catalog.
func NewCache(cfg CacheConfig) *Cache {
	if cfg.TTL <= 0 {
		cfg.TTL = 5 * time.Second
	}
	if cfg.MissRefresh == 0 {
		cfg.MissRefresh = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cache{cfg: cfg, listings: map[string]*listing{}, defaultNS: cfg.DefaultNamespace}
}

// Function returns the function ref names ("name" or "name.namespace") from the cached listing of its namespace,
// reading the listing again when it is older than the TTL, or when the name is missing and the last read is older
// than MissRefresh. When the catalog cannot be read, a cached entry is used however old; without one the error is
// returned (not ErrUnknownFunction: the caller should retry later). A namespace the catalog does not have holds no
// function (ErrUnknownFunction).
func (c *Cache) Function(ctx context.Context, ref string) (Function, error) {
	name, ns, err := queue.SplitFunction(ref)
	if err != nil {
		return Function{}, fmt.Errorf("%w: %w", ErrUnknownFunction, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns != "" && c.defaultNS == "" && c.listings[""] == nil {
		_, _ = c.refreshLocked(ctx, "") // learn the default namespace's name first; an error shows again below
	}
	if ns != "" && ns == c.defaultNS {
		ns = "" // one listing, one canonical name, for "echo" and "echo.openfaas-fn"
	}
	now := c.cfg.Now()
	l := c.listings[ns]
	var f Function
	ok := false
	if l != nil {
		f, ok = l.byName[name]
		age := now.Sub(l.fetchedAt)
		if ok && age < c.cfg.TTL {
			return f, nil
		}
		if !ok && c.cfg.MissRefresh > 0 && age < c.cfg.MissRefresh {
			return Function{}, fmt.Errorf("%w: %s", ErrUnknownFunction, ref)
		}
	}
	l, err = c.refreshLocked(ctx, ns)
	switch {
	case errors.Is(err, ErrUnknownNamespace):
		return Function{}, fmt.Errorf("%w: %s: %w", ErrUnknownFunction, ref, err)
	case err != nil && ok:
		return f, nil
	case err != nil:
		return Function{}, err
	}
	if f, ok := l.byName[name]; ok {
		return f, nil
	}
	return Function{}, fmt.Errorf("%w: %s", ErrUnknownFunction, ref)
}

// Functions lists every function of every namespace the catalog has (only the default namespace, and those
// asked for before, when it cannot list its namespaces), from the cache where it is fresh.
func (c *Cache) Functions(ctx context.Context) ([]Function, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	namespaces := []string{""}
	for ns := range c.listings {
		if ns != "" {
			namespaces = append(namespaces, ns)
		}
	}
	if all, err := c.namespacesLocked(ctx); err == nil {
		for _, ns := range all {
			if ns != c.defaultNS && !slices.Contains(namespaces, ns) {
				namespaces = append(namespaces, ns)
			}
		}
	}
	var out []Function
	for _, ns := range namespaces {
		l := c.listings[ns]
		if l == nil || c.cfg.Now().Sub(l.fetchedAt) >= c.cfg.TTL {
			var err error
			if l, err = c.refreshLocked(ctx, ns); errors.Is(err, ErrUnknownNamespace) {
				continue
			} else if err != nil {
				return nil, err
			}
		}
		if ns != "" && ns == c.defaultNS {
			continue // listed as ""
		}
		for _, f := range l.byName {
			out = append(out, f)
		}
	}
	return out, nil
}

// namespacesLocked returns the catalog's namespaces, read at most once per TTL.
func (c *Cache) namespacesLocked(ctx context.Context) ([]string, error) {
	if c.nsAt.IsZero() || c.cfg.Now().Sub(c.nsAt) >= c.cfg.TTL {
		c.nsList, c.nsErr = c.cfg.Catalog.Namespaces(ctx)
		c.nsAt = c.cfg.Now()
	}
	return c.nsList, c.nsErr
}

// refreshLocked reads namespace ns ("" the default) and caches it.
func (c *Cache) refreshLocked(ctx context.Context, ns string) (*listing, error) {
	if ns != "" {
		if all, err := c.namespacesLocked(ctx); err == nil && !slices.Contains(all, ns) {
			delete(c.listings, ns)
			return nil, fmt.Errorf("%w: %s", ErrUnknownNamespace, ns)
		}
	}
	list, err := c.cfg.Catalog.List(ctx, ns)
	if err != nil {
		if errors.Is(err, ErrUnknownNamespace) {
			delete(c.listings, ns)
		}
		return nil, err
	}
	if ns == "" {
		for _, st := range list {
			if st.Namespace != "" {
				c.defaultNS = st.Namespace
				break
			}
		}
	}
	l := &listing{byName: make(map[string]Function, len(list)), fetchedAt: c.cfg.Now()}
	for _, st := range list {
		var ann map[string]string
		if st.Annotations != nil {
			ann = *st.Annotations
		}
		ref := st.Name
		if ns != "" {
			ref = st.Name + "." + ns
		}
		l.byName[st.Name] = FromAnnotations(ref, ann)
	}
	c.listings[ns] = l
	return l, nil
}

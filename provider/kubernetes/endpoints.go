package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// byService is the name of the endpoint cache's index of EndpointSlices by their kubernetes.io/service-name label.
const byService = "service"

// endpointCache keeps the EndpointSlices of function namespaces in shared informers, one per namespace, each
// listing and watching only slices labelled kubernetes.io/service-name and indexed by that label. It is empty until
// start; an informer is used once it has synced, and reads before that go to the API server.
type endpointCache struct {
	client kubernetes.Interface

	mu        sync.Mutex
	ctx       context.Context    // informers run under it; nil before start and after stop
	cancel    context.CancelFunc // stops every informer
	started   bool
	informers map[string]cache.SharedIndexInformer // by namespace
	wg        sync.WaitGroup                       // the informers' goroutines
}

func newEndpointCache(client kubernetes.Interface) *endpointCache {
	return &endpointCache{client: client, informers: map[string]cache.SharedIndexInformer{}}
}

// start runs informers under ctx (until ctx ends or stop) and starts one for each namespace given.
func (c *endpointCache) start(ctx context.Context, namespaces ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("endpoint cache: started twice")
	}
	c.started = true
	c.ctx, c.cancel = context.WithCancel(ctx)
	for _, ns := range namespaces {
		c.runLocked(ns)
	}
	return nil
}

// context is the context the informers run under (it ends with stop); nil before start.
func (c *endpointCache) context() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx
}

// running reports whether the cache was started and has not been stopped.
func (c *endpointCache) running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx != nil && c.ctx.Err() == nil
}

// has reports whether an informer runs for namespace (synced or not).
func (c *endpointCache) has(namespace string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.informers[namespace]
	return ok
}

// ensure starts the informer of namespace if the cache runs and it has none yet.
func (c *endpointCache) ensure(namespace string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || c.ctx.Err() != nil {
		return
	}
	if _, ok := c.informers[namespace]; !ok {
		c.runLocked(namespace)
	}
}

func (c *endpointCache) runLocked(namespace string) {
	inf := discoveryinformers.NewFilteredEndpointSliceInformer(c.client, namespace, 0,
		cache.Indexers{byService: serviceIndex},
		func(o *metav1.ListOptions) { o.LabelSelector = LabelServiceName })
	// Managed fields are never read; dropping them keeps the cache small.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
	c.informers[namespace] = inf
	ctx := c.ctx
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		inf.RunWithContext(ctx)
	}()
}

// indexer returns the synced store of namespace, or nil when the namespace has no informer or it has not synced yet.
func (c *endpointCache) indexer(namespace string) cache.Indexer {
	c.mu.Lock()
	inf, ok := c.informers[namespace]
	running := c.ctx != nil && c.ctx.Err() == nil
	c.mu.Unlock()
	if !ok || !running || !inf.HasSynced() {
		return nil
	}
	return inf.GetIndexer()
}

// stop ends every informer and waits until their goroutines have returned or ctx ends.
func (c *endpointCache) stop(ctx context.Context) error {
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.ctx = nil
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("endpoint cache: informers still running: %w", ctx.Err())
	}
}

// serviceIndex indexes an EndpointSlice by the Service it belongs to.
func serviceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, fmt.Errorf("endpoint cache: unexpected object %T", obj)
	}
	if name, ok := s.Labels[LabelServiceName]; ok {
		return []string{name}, nil
	}
	return nil, nil
}

// cachedSlices returns the cached EndpointSlices of one Service (service != "") or of every Service in store.
func cachedSlices(store cache.Indexer, service string) ([]*discoveryv1.EndpointSlice, error) {
	var objs []any
	if service == "" {
		objs = store.List()
	} else {
		var err error
		if objs, err = store.ByIndex(byService, service); err != nil {
			return nil, fmt.Errorf("endpoint cache: %w", err)
		}
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// readyHosts returns host:port of every ready endpoint of slices, in the order of the slices' names and of the
// endpoints within a slice (the cache returns slices in no particular order, round-robin needs a stable one). The
// port is the slice's "http" (or unnamed) port, else defaultPort.
func readyHosts(slices []*discoveryv1.EndpointSlice, defaultPort int32) []string {
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	var hosts []string
	for _, s := range slices {
		port := defaultPort
		for _, p := range s.Ports {
			if p.Port != nil && (p.Name == nil || *p.Name == "http" || *p.Name == "") {
				port = *p.Port
				break
			}
		}
		for _, e := range s.Endpoints {
			if endpointReady(e) && len(e.Addresses) > 0 {
				hosts = append(hosts, net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port))))
			}
		}
	}
	return hosts
}

// countReady counts the ready endpoints of slices by Service name; a Service with slices but no ready endpoint
// maps to 0.
func countReady(slices []*discoveryv1.EndpointSlice) map[string]int {
	ready := map[string]int{}
	for _, s := range slices {
		svc := s.Labels[LabelServiceName]
		ready[svc] += 0
		for _, e := range s.Endpoints {
			if endpointReady(e) && len(e.Addresses) > 0 {
				ready[svc]++
			}
		}
	}
	return ready
}

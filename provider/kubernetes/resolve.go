package kubernetes

import (
	"context"
	"fmt"
	"net/url"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/gpuserver/router"
	"github.com/faas-gpu/faas-gpu/provider"
)

// Resolve returns the URL of a ready replica, taken from the function Service's EndpointSlices: with
// Config.GPUServers, the replica whose node suits the request best now (router.PickReplica on the nodes'
// gpuserver reports), else, and where reports are missing or stale, in round-robin order; Routes counts the
// picks by what decided them. It fails with ErrNotFound when the Service does not exist and ErrNotReady when no
// endpoint is ready.
//
// Once Start has run, the slices come from the endpoint cache and a resolve makes no API call while the function
// has a ready endpoint; before the namespace's informer has synced (and without Start) they are listed from the API
// server. With the cache running, a namespace other than the default one must pass CheckNamespace the first time
// (as a deploy there must), which starts its informer.
func (b *Backend) Resolve(ctx context.Context, namespace, name string) (*url.URL, error) {
	ns, err := b.target(namespace, name)
	if err != nil {
		return nil, err
	}
	if err := b.watchNamespace(ctx, ns); err != nil {
		return nil, err
	}
	slices, err := b.endpointSlices(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	replicas := readyReplicas(slices, b.cfg.HTTPPort)
	if len(replicas) == 0 {
		if _, err := b.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, APIError("get service "+name, err)
		}
		return nil, fmt.Errorf("function %s.%s has no ready endpoint: %w", name, ns, provider.ErrNotReady)
	}
	rr := b.next.Add(1)
	i, why := int(rr%uint64(len(replicas))), router.PickRoundRobin
	if b.nodes != nil {
		i, why = b.nodes.pick(GPUFunctionName(name, ns), replicas, rr)
	}
	b.routes.add(why)
	return &url.URL{Scheme: "http", Host: replicas[i].Addr}, nil
}

// Routes counts the replicas Resolve has chosen since the backend was made, by what decided each.
func (b *Backend) Routes() RouteCounts { return b.routes.counts() }

// watchNamespace starts the endpoint cache's informer for ns after checking that ns is a function namespace; it
// does nothing when the cache is not running or watches ns already.
func (b *Backend) watchNamespace(ctx context.Context, ns string) error {
	if !b.endpoints.running() || b.endpoints.has(ns) {
		return nil
	}
	if err := b.CheckNamespace(ctx, ns); err != nil {
		return err
	}
	b.endpoints.ensure(ns)
	return nil
}

// endpointSlices returns the EndpointSlices of one Service of ns (or of every Service, service == ""): from the
// endpoint cache once its informer for ns has synced, else listed from the API server.
func (b *Backend) endpointSlices(ctx context.Context, ns, service string) ([]*discoveryv1.EndpointSlice, error) {
	if store := b.endpoints.indexer(ns); store != nil {
		return cachedSlices(store, service)
	}
	selector := LabelServiceName
	if service != "" {
		selector = LabelServiceName + "=" + service
	}
	list, err := b.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, APIError("list endpointslices in "+ns, err)
	}
	out := make([]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

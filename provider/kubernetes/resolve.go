package kubernetes

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/provider"
)

// Resolve returns the URL of a ready replica, taken from the function Service's EndpointSlices in round-robin
// order. It fails with ErrNotFound when the Service does not exist and ErrNotReady when no endpoint is ready.
func (b *Backend) Resolve(ctx context.Context, namespace, name string) (*url.URL, error) {
	ns, err := b.target(namespace, name)
	if err != nil {
		return nil, err
	}
	slices, err := b.client.DiscoveryV1().EndpointSlices(ns).List(ctx,
		metav1.ListOptions{LabelSelector: LabelServiceName + "=" + name})
	if err != nil {
		return nil, APIError("list endpointslices of "+name, err)
	}
	var hosts []string
	for _, s := range slices.Items {
		port := b.cfg.HTTPPort
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
	if len(hosts) == 0 {
		if _, err := b.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, APIError("get service "+name, err)
		}
		return nil, fmt.Errorf("function %s.%s has no ready endpoint: %w", name, ns, provider.ErrNotReady)
	}
	i := b.next.Add(1) % uint64(len(hosts))
	return &url.URL{Scheme: "http", Host: hosts[i]}, nil
}

package kubernetes

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// endpoint is one endpoint of a test EndpointSlice; ready nil leaves the condition unset (ready, as Kubernetes
// says).
type endpoint struct {
	addr  string
	ready *bool
}

// ready and unready are the endpoint conditions of test slices.
var ready, unready = boolPtr(true), boolPtr(false)

func boolPtr(v bool) *bool { return &v }

func endpointSlice(name, service string, eps ...endpoint) *discoveryv1.EndpointSlice {
	port, portName := int32(8080), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready}})
	}
	return s
}

func functionService(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelFunction: name}}}
}

// startedBackend returns a started backend whose informers are stopped at the end of the test. watching receives a
// value each time an EndpointSlice watch is registered with the fake's tracker: the fake does not replay what
// happened between an informer's list and its watch, so tests change slices only once the watch is in place.
func startedBackend(t *testing.T, objects ...runtime.Object) (b *Backend, client *fake.Clientset, watching chan string) {
	t.Helper()
	objects = append(objects, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	client = fake.NewClientset(objects...)
	watching = make(chan string, 16)
	client.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		select {
		case watching <- a.GetNamespace():
		default:
		}
		return true, w, nil
	})
	b, err := New(client, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return b, client, watching
}

// waitWatching waits until the cache of namespace has synced and its watch is registered.
func waitWatching(t *testing.T, b *Backend, watching chan string, namespace string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-watching:
			if got == namespace {
				testkit.Eventually(t, 30*time.Second, "the cache of "+namespace+" to sync", func() bool { return b.endpoints.indexer(namespace) != nil })
				return
			}
		case <-timeout:
			t.Fatalf("no EndpointSlice watch on %s", namespace)
		}
	}
}

// apiCalls counts the fake's recorded actions of verb on resource; an endpointslices list made by an informer
// carries a resource version ("0"), a direct one none.
func apiCalls(client *fake.Clientset, verb, resource string) (direct, informer int) {
	for _, a := range client.Actions() {
		if a.GetVerb() != verb || a.GetResource().Resource != resource {
			continue
		}
		if l, ok := a.(k8stesting.ListActionImpl); ok && l.ListOptions.ResourceVersion != "" {
			informer++
			continue
		}
		direct++
	}
	return direct, informer
}

func resolveHost(b *Backend, name string) (string, error) {
	u, err := b.Resolve(context.Background(), ns, name)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

func TestResolveFollowsEndpointSliceEvents(t *testing.T) {
	ctx := context.Background()
	b, client, watching := startedBackend(t, functionService("resnet"))
	waitWatching(t, b, watching, ns)
	if _, err := b.Resolve(ctx, ns, "resnet"); !errors.Is(err, provider.ErrNotReady) {
		t.Fatalf("resolve without slices: %v, want ErrNotReady", err)
	}
	slices := client.DiscoveryV1().EndpointSlices(ns)

	if _, err := slices.Create(ctx, endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the created slice", func() bool { h, _ := resolveHost(b, "resnet"); return h == "10.0.0.1:8080" })

	upd := endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", unready}, endpoint{"10.0.0.2", ready})
	if _, err := slices.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the updated slice", func() bool { h, _ := resolveHost(b, "resnet"); return h == "10.0.0.2:8080" })
	for range 5 {
		if h, err := resolveHost(b, "resnet"); h != "10.0.0.2:8080" {
			t.Fatalf("resolved %q, %v: want only the ready 10.0.0.2", h, err)
		}
	}
	st, err := b.Status(ctx, ns, "resnet")
	if !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("status without a deployment: %+v %v", st, err)
	}

	if err := slices.Delete(ctx, "resnet-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the deleted slice", func() bool {
		_, err := b.Resolve(ctx, ns, "resnet")
		return errors.Is(err, provider.ErrNotReady)
	})
	if _, err := b.Resolve(ctx, ns, "nope"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("resolve of an unknown function: %v, want ErrNotFound", err)
	}
	if direct, _ := apiCalls(client, "list", "endpointslices"); direct != 0 {
		t.Errorf("%d direct EndpointSlice lists after sync, want 0", direct)
	}
}

func TestResolveRoundRobinOverReadyEndpoints(t *testing.T) {
	b, _, watching := startedBackend(t, functionService("bert"),
		endpointSlice("bert-b", "bert", endpoint{"10.0.1.4", nil}),
		endpointSlice("bert-a", "bert", endpoint{"10.0.1.1", ready}, endpoint{"10.0.1.2", unready}, endpoint{"10.0.1.3", ready}),
		endpointSlice("other-a", "other", endpoint{"10.0.9.9", ready}))
	waitWatching(t, b, watching, ns)
	var got []string
	for range 9 {
		h, err := resolveHost(b, "bert")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h)
	}
	seen := map[string]int{}
	for i, h := range got {
		seen[h]++
		if i >= 3 && got[i-3] != h {
			t.Errorf("resolves %v do not cycle with period 3", got)
			break
		}
	}
	want := []string{"10.0.1.1:8080", "10.0.1.3:8080", "10.0.1.4:8080"}
	for _, h := range want {
		if seen[h] != 3 {
			t.Errorf("resolves %v: %s %d times, want 3 (ready endpoints %v, never 10.0.1.2 or another service's)", got, h, seen[h], want)
		}
	}
}

func TestResolveMakesNoAPICallsAfterSync(t *testing.T) {
	const n = 200
	b, client, watching := startedBackend(t, functionService("resnet"),
		endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready}, endpoint{"10.0.0.2", ready}))
	waitWatching(t, b, watching, ns)
	before := len(client.Actions())
	_, informerLists := apiCalls(client, "list", "endpointslices")
	for range n {
		if _, err := b.Resolve(context.Background(), ns, "resnet"); err != nil {
			t.Fatal(err)
		}
	}
	var calls []string
	for _, a := range client.Actions()[before:] {
		if a.GetVerb() != "watch" { // a re-established watch is the informer's business, not a resolve's
			calls = append(calls, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	if len(calls) != 0 {
		t.Errorf("%d resolves after sync made %d API calls (first: %v), want none", n, len(calls), calls[:min(len(calls), 3)])
	}
	direct, informer := apiCalls(client, "list", "endpointslices")
	if direct != 0 || informer != informerLists {
		t.Errorf("EndpointSlice lists: %d direct, %d by the informer (was %d), want 0 and unchanged", direct, informer, informerLists)
	}
}

func TestStatusReadsEndpointCache(t *testing.T) {
	ctx := context.Background()
	b, client, watching := startedBackend(t)
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	waitWatching(t, b, watching, ns)
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx,
		endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready}, endpoint{"10.0.0.2", unready}, endpoint{"10.0.0.3", ready}),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "status to count 2 ready endpoints", func() bool {
		st, err := b.Status(ctx, ns, "resnet")
		return err == nil && st.AvailableReplicas == 2
	})
	list, err := b.List(ctx, ns)
	if err != nil || len(list) != 1 || list[0].AvailableReplicas != 2 {
		t.Errorf("list %+v %v, want resnet with 2 available", list, err)
	}
	if direct, _ := apiCalls(client, "list", "endpointslices"); direct != 0 {
		t.Errorf("%d direct EndpointSlice lists for status after sync, want 0", direct)
	}
}

func TestResolveFallsBackBeforeSync(t *testing.T) {
	ctx := context.Background()
	objects := []runtime.Object{functionService("resnet"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready})}
	client := fake.NewClientset(objects...)
	var release atomic.Bool
	var held atomic.Int32
	// The informer's lists (they carry a resource version) fail until release: the cache cannot sync before. (A
	// reactor must not block: the fake holds its lock while reactors run.)
	client.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if l, ok := a.(k8stesting.ListActionImpl); ok && l.ListOptions.ResourceVersion != "" && !release.Load() {
			held.Add(1)
			return true, nil, errors.New("api server unavailable")
		}
		return false, nil, nil
	})
	b, err := New(client, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := b.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()
	testkit.Eventually(t, 30*time.Second, "the informer's failed list", func() bool { return held.Load() > 0 })
	for i := 1; i <= 3; i++ {
		u, err := b.Resolve(ctx, ns, "resnet")
		if err != nil || u.Host != "10.0.0.1:8080" {
			t.Fatalf("resolve before sync: %v %v", u, err)
		}
		if direct, _ := apiCalls(client, "list", "endpointslices"); direct != i {
			t.Errorf("after %d resolves before sync: %d direct lists, want %d", i, direct, i)
		}
	}
	if b.endpoints.indexer(ns) != nil {
		t.Fatal("cache synced while its lists failed")
	}
	release.Store(true)
	// The reflector retries after its backoff (about a second).
	testkit.Eventually(t, 30*time.Second, "the cache to sync", func() bool { return b.endpoints.indexer(ns) != nil })
	direct, _ := apiCalls(client, "list", "endpointslices")
	for range 10 {
		if u, err := b.Resolve(ctx, ns, "resnet"); err != nil || u.Host != "10.0.0.1:8080" {
			t.Fatalf("resolve after sync: %v %v", u, err)
		}
	}
	if after, _ := apiCalls(client, "list", "endpointslices"); after != direct {
		t.Errorf("direct lists went from %d to %d over 10 resolves after sync, want none", direct, after)
	}
}

func TestResolveOtherNamespaces(t *testing.T) {
	ctx := context.Background()
	labelled := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a",
		Labels: map[string]string{LabelNamespace: LabelNamespaceValue}}}
	plain := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}
	svc := functionService("bert")
	svc.Namespace = "team-a"
	slice := endpointSlice("bert-a", "bert", endpoint{"10.0.2.1", ready})
	slice.Namespace = "team-a"
	b, client, watching := startedBackend(t, labelled, plain, svc, slice)
	if _, err := b.Resolve(ctx, "kube-system", "coredns"); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("resolve in a namespace not labelled openfaas=1: %v, want ErrInvalid", err)
	}
	if _, err := b.Resolve(ctx, "absent", "x"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("resolve in a missing namespace: %v, want ErrNotFound", err)
	}
	// The first resolve in team-a checks the namespace and starts its informer; it answers (listing) before sync.
	u, err := b.Resolve(ctx, "team-a", "bert")
	if err != nil || u.Host != "10.0.2.1:8080" {
		t.Fatalf("first resolve in team-a: %v %v", u, err)
	}
	waitWatching(t, b, watching, "team-a")
	direct, _ := apiCalls(client, "list", "endpointslices")
	nsGets, _ := apiCalls(client, "get", "namespaces")
	for range 10 {
		if u, err := b.Resolve(ctx, "team-a", "bert"); err != nil || u.Host != "10.0.2.1:8080" {
			t.Fatalf("resolve in team-a: %v %v", u, err)
		}
	}
	after, _ := apiCalls(client, "list", "endpointslices")
	afterGets, _ := apiCalls(client, "get", "namespaces")
	if after != direct || afterGets != nsGets {
		t.Errorf("10 cached resolves in team-a: lists %d -> %d, namespace gets %d -> %d, want unchanged", direct, after, nsGets, afterGets)
	}
}

func TestStopEndsInformers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	client := fake.NewClientset(functionService("resnet"), endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready}))
	b, err := New(client, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Errorf("stop before start: %v", err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err == nil {
		t.Error("second start succeeded")
	}
	testkit.Eventually(t, 30*time.Second, "the cache to sync", func() bool { return b.endpoints.indexer(ns) != nil })
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if b.endpoints.indexer(ns) != nil {
		t.Error("cache still answers after stop")
	}
	if u, err := b.Resolve(ctx, ns, "resnet"); err != nil || u.Host != "10.0.0.1:8080" {
		t.Errorf("resolve after stop (listing): %v %v", u, err)
	}
}

package kubernetes

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// gpuserverSlice is one node's gpuserver endpoint (the DaemonSet's headless Service) at addr, on node.
func gpuserverSlice(node, addr string) *discoveryv1.EndpointSlice {
	host, portS, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(portS)
	port, name := int32(p), "metrics"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuserver-" + node, Namespace: "faas-gpu",
			Labels: map[string]string{LabelServiceName: "faas-gpu-gpuserver"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: ready}}},
	}
}

// nodesKey is the gpuservers' key of the node-report tests: GET /v1/pool takes its administrator's credential.
var nodesKey = auth.Key("0123456789abcdef0123456789abcdef")

// gpuserverAt serves a pool status on a test server and returns its address; as a gpuserver, it answers 401 to a
// request without the administrator's credential.
func gpuserverAt(t *testing.T, st *pool.Status) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/pool" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+nodesKey.AdminToken() {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestResolveRoutesToTheBestNode: three replicas of a GPU function on nodes a, b and c, each node's gpuserver
// reporting its pool. Resolve sends requests to the replica whose node holds the model on a GPU, then (once that
// node sheds the function) to the node with the shortest queue per GPU; with every report stale it falls back to
// round robin over all three.
func TestResolveRoutesToTheBestNode(t *testing.T) {
	gpu := GPUFunctionName("resnet", ns)
	status := func(queued int, resident, shed bool) *pool.Status {
		f := pool.FunctionStatus{FunctionSpec: pool.FunctionSpec{Name: gpu}, Shed: shed}
		if resident {
			f.Resident = []int{0}
		}
		return &pool.Status{Queued: queued, GPUs: []pool.GPUStatus{{Healthy: true}, {Healthy: true}},
			Functions: []pool.FunctionStatus{f}}
	}
	sa, sb, sc := status(0, false, false), status(5, true, false), status(2, false, false)
	objects := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, functionService("resnet"),
		gpuserverSlice("a", gpuserverAt(t, sa)), gpuserverSlice("b", gpuserverAt(t, sb)),
		gpuserverSlice("c", gpuserverAt(t, sc))}
	fn := endpointSlice("resnet-a", "resnet", endpoint{"10.0.0.1", ready}, endpoint{"10.0.1.1", ready},
		endpoint{"10.0.2.1", ready})
	for i, node := range []string{"a", "b", "c"} {
		fn.Endpoints[i].NodeName = &node
	}
	objects = append(objects, fn)
	cfg := DefaultConfig()
	cfg.GPUServers = "faas-gpu/faas-gpu-gpuserver"
	cfg.GPU.RegistrationKey = nodesKey
	b, err := New(fake.NewClientset(objects...), cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.nodes.now = func() time.Time { return now }
	ctx := context.Background()
	resolve := func() string {
		t.Helper()
		u, err := b.Resolve(ctx, ns, "resnet")
		if err != nil {
			t.Fatal(err)
		}
		return u.Host
	}
	resolve() // before any report: round robin
	b.nodes.poll(ctx)
	for range 4 {
		if h := resolve(); h != "10.0.1.1:8080" {
			t.Fatalf("resolved %s, want node b's replica (the model is resident there)", h)
		}
	}
	*sb = *status(5, true, true) // b sheds it now
	b.nodes.poll(ctx)
	if h := resolve(); h != "10.0.0.1:8080" {
		t.Fatalf("resolved %s, want node a's replica (the shortest queue; b sheds)", h)
	}
	now = now.Add(time.Minute) // every report stale: round robin
	seen := map[string]bool{}
	for range 3 {
		seen[resolve()] = true
	}
	if len(seen) != 3 {
		t.Fatalf("stale reports: resolved %v, want round robin over all three", seen)
	}
	if got, want := b.Routes(), (RouteCounts{Resident: 4, LeastQueued: 1, RoundRobin: 4}); got != want {
		t.Fatalf("routes counted %+v, want %+v", got, want)
	}
	cfg.GPUServers = "no-slash"
	if _, err := New(fake.NewClientset(), cfg); err == nil {
		t.Fatal("a GPUServers without namespace/ was accepted")
	}
}

package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/router"
)

// Defaults of the node reports.
const (
	DefaultNodeReportEvery  = time.Second
	DefaultNodeReportMaxAge = 3 * time.Second
	// maxStatusBytes bounds a gpuserver's pool status read by the provider.
	maxStatusBytes = 8 << 20
)

// nodeReports polls every node's gpuserver (the endpoints of its headless Service, each on the node it runs on)
// for its pool status, so that Resolve can send a request to the replica whose node suits it best now
// (router.PickReplica). A report that is missing or older than maxAge leaves the choice to round robin.
type nodeReports struct {
	client    kubernetes.Interface
	namespace string // of the gpuservers' Service
	service   string
	token     string // the gpuservers' administrator credential: GET /v1/pool takes one
	every     time.Duration
	maxAge    time.Duration
	http      *http.Client
	now       func() time.Time

	mu      sync.Mutex
	reports map[string]router.NodeReport // by node name
	done    chan struct{}                // closed when the polling loop has returned; nil before start
}

// RouteCounts counts the replicas Resolve chose, by what decided each (router.PickReplica's reasons): a node
// holding the function's model on a GPU, the least queued node, every fresh node shedding it, or round robin
// (no fresh node report, or no -gpuserver-service).
type RouteCounts struct {
	Resident, LeastQueued, Shedding, RoundRobin uint64
}

// routeCounter counts Resolve's picks.
type routeCounter struct {
	resident, leastQueued, shedding, roundRobin atomic.Uint64
}

func (c *routeCounter) add(why router.Reason) {
	switch why {
	case router.PickResident:
		c.resident.Add(1)
	case router.PickLeastQueued:
		c.leastQueued.Add(1)
	case router.PickShedding:
		c.shedding.Add(1)
	default:
		c.roundRobin.Add(1)
	}
}

func (c *routeCounter) counts() RouteCounts {
	return RouteCounts{Resident: c.resident.Load(), LeastQueued: c.leastQueued.Load(), Shedding: c.shedding.Load(),
		RoundRobin: c.roundRobin.Load()}
}

func newNodeReports(client kubernetes.Interface, service, token string, every, maxAge time.Duration) (*nodeReports,
	error) {
	ns, name, ok := strings.Cut(service, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("gpuserver service %q: want namespace/name", service)
	}
	return &nodeReports{client: client, namespace: ns, service: name, token: token, every: every, maxAge: maxAge,
		http: &http.Client{Timeout: every}, now: time.Now, reports: map[string]router.NodeReport{}}, nil
}

// start polls until ctx ends.
func (n *nodeReports) start(ctx context.Context) {
	n.mu.Lock()
	n.done = make(chan struct{})
	n.mu.Unlock()
	go func() {
		defer close(n.done)
		t := time.NewTicker(n.every)
		defer t.Stop()
		for {
			n.poll(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// wait returns once the polling loop has returned (after its ctx ended) or ctx ends.
func (n *nodeReports) wait(ctx context.Context) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node reports: still polling: %w", ctx.Err())
	}
}

// poll fetches every gpuserver's status once; a gpuserver that does not answer keeps its last report, which ages.
func (n *nodeReports) poll(ctx context.Context) {
	list, err := n.client.DiscoveryV1().EndpointSlices(n.namespace).List(ctx,
		metav1.ListOptions{LabelSelector: LabelServiceName + "=" + n.service})
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	for i := range list.Items {
		s := &list.Items[i]
		port := int32(0)
		for _, p := range s.Ports {
			if p.Port != nil {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if !endpointReady(e) || len(e.Addresses) == 0 || e.NodeName == nil {
				continue
			}
			addr, node := net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port))), *e.NodeName
			wg.Add(1)
			go func() {
				defer wg.Done()
				if st, err := n.fetch(ctx, addr); err == nil {
					n.mu.Lock()
					n.reports[node] = router.ReportOf(st, n.now())
					n.mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
}

func (n *nodeReports) fetch(ctx context.Context, addr string) (pool.Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/pool", nil)
	if err != nil {
		return pool.Status{}, err
	}
	if n.token != "" {
		req.Header.Set("Authorization", "Bearer "+n.token)
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return pool.Status{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return pool.Status{}, fmt.Errorf("gpuserver %s: %s", addr, resp.Status)
	}
	var st pool.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(&st); err != nil {
		return pool.Status{}, fmt.Errorf("gpuserver %s: %w", addr, err)
	}
	return st, nil
}

// pick chooses among replicas for function (its gpuserver name), and says what decided (round robin when no fresh
// report did).
func (n *nodeReports) pick(function string, replicas []router.Replica, rr uint64) (int, router.Reason) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return router.PickReplica(n.now(), function, replicas, n.reports, n.maxAge, rr)
}

// readyReplicas returns every ready endpoint of slices with the node it runs on, in the order readyHosts uses.
func readyReplicas(slices []*discoveryv1.EndpointSlice, defaultPort int32) []router.Replica {
	hosts := readyHosts(slices, defaultPort)
	out := make([]router.Replica, 0, len(hosts))
	k := 0
	for _, s := range slices { // readyHosts sorted slices by name
		for _, e := range s.Endpoints {
			if endpointReady(e) && len(e.Addresses) > 0 {
				node := ""
				if e.NodeName != nil {
					node = *e.NodeName
				}
				out = append(out, router.Replica{Addr: hosts[k], Node: node})
				k++
			}
		}
	}
	return out
}

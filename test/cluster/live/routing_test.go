package live

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// testKubernetesRouting: the provider chooses a GPU function's replica from its node's gpuserver report
// (router.PickReplica), not by the round robin it falls back to without a fresh report. hello-gpu has served a
// request, so its model is on a GPU of the single node; the gpuserver reports it resident, and an invocation
// through the provider is counted as routed to a node holding the model:
// faas_gpu_provider_routes_total{reason="resident"} grows on the provider's /metrics.
func testKubernetesRouting(t *testing.T) {
	e := cluster(t)
	g := e.provider(t)
	invoke(t, g, "hello-gpu", "{}")
	testkit.EventuallyNilEvery(t, deadline, time.Second, "hello-gpu's model resident in the pool status", func() error {
		f, ok := findFunction(e.poolStatus(t), "hello-gpu")
		if !ok || len(f.Resident) == 0 {
			return fmt.Errorf("hello-gpu registered %t, resident on GPUs %v", ok, f.Resident)
		}
		return nil
	})
	before := routes(t, g)
	var after map[string]float64
	// The provider polls the reports every second and uses one for 3 s: a request may still find none fresh.
	testkit.EventuallyNilEvery(t, deadline, time.Second, "an invocation routed by the node's report", func() error {
		invoke(t, g, "hello-gpu", "{}")
		after = routes(t, g)
		if after["resident"] > before["resident"] {
			return nil
		}
		return fmt.Errorf("routes before %v, after %v: no pick decided by a resident model", before, after)
	})
	t.Logf("provider routes before %v, after invoking hello-gpu %v", before, after)
}

// routes reads faas_gpu_provider_routes_total by reason from the provider's /metrics.
func routes(t *testing.T, g gateway) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	testkit.EventuallyNilEvery(t, deadline, time.Second, "the provider's routes metric", func() error {
		code, b, _, err := g.do(http.MethodGet, "/metrics", nil, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET /metrics: %d", code)
		}
		const name = `faas_gpu_provider_routes_total{reason="`
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), name)
			if !ok {
				continue
			}
			reason, value, ok := strings.Cut(rest, `"} `)
			if !ok {
				return fmt.Errorf("unreadable line %q", sc.Text())
			}
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return fmt.Errorf("line %q: %w", sc.Text(), err)
			}
			out[reason] = v
		}
		if len(out) == 0 {
			return fmt.Errorf("no faas_gpu_provider_routes_total on /metrics")
		}
		return nil
	})
	return out
}

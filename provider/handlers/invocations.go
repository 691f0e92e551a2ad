package handlers

import (
	"strconv"
	"sync"

	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"
)

// invocations counts the requests the proxy forwarded per function, so that GET /system/functions and
// /system/function/{name} answer InvocationCount (what `faas-cli list` shows) without the OpenFaaS gateway's
// Prometheus. With Config.GatewayMetrics the counts are also the gateway's gateway_function_invocation_total.
type invocations struct {
	mu     sync.Mutex
	counts map[string]float64 // by "name.namespace", as the gateway names functions in its metrics
	metric *prometheus.CounterVec
}

func newInvocations(reg prometheus.Registerer, gatewayMetrics bool) *invocations {
	inv := &invocations{counts: map[string]float64{}}
	if gatewayMetrics {
		inv.metric = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_function_invocation_total", Help: "Function metrics",
		}, []string{"function_name", "code"})
		reg.MustRegister(inv.metric)
	}
	return inv
}

func invocationKey(name, namespace string) string { return name + "." + namespace }

// add counts one invocation of a function and its status code.
func (inv *invocations) add(name, namespace string, code int) {
	key := invocationKey(name, namespace)
	inv.mu.Lock()
	inv.counts[key]++
	inv.mu.Unlock()
	if inv.metric != nil {
		inv.metric.WithLabelValues(key, strconv.Itoa(code)).Inc()
	}
}

// forget drops a deleted function's counts.
func (inv *invocations) forget(name, namespace string) {
	key := invocationKey(name, namespace)
	inv.mu.Lock()
	delete(inv.counts, key)
	inv.mu.Unlock()
	if inv.metric != nil {
		inv.metric.DeletePartialMatch(prometheus.Labels{"function_name": key})
	}
}

// fill sets InvocationCount of a status the backend reported without one.
func (inv *invocations) fill(st *types.FunctionStatus, namespace string) {
	if st.InvocationCount != 0 {
		return
	}
	ns := st.Namespace
	if ns == "" {
		ns = namespace
	}
	inv.mu.Lock()
	st.InvocationCount = inv.counts[invocationKey(st.Name, ns)]
	inv.mu.Unlock()
}

package handlers

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"
)

// invocations counts the requests the proxy forwarded per function, so that GET /system/functions and
// /system/function/{name} answer InvocationCount (what `faas-cli list` shows) without the OpenFaaS gateway's
// Prometheus. With Config.GatewayMetrics the counts are also the gateway's gateway_function_invocation_total.
// With a file (Config.InvocationsFile) the counts survive restarts: read at start, written (whole, renamed into
// place) at most once per invocationsWriteEvery while they change.
type invocations struct {
	mu     sync.Mutex
	counts map[string]float64 // by "name.namespace", as the gateway names functions in its metrics
	metric *prometheus.CounterVec

	file    string // "" keeps the counts in memory only
	log     *slog.Logger
	written time.Time // the last write of file
	pending bool      // a write is due (a timer armed)
}

// invocationsWriteEvery bounds how often the counts file is written while invocations come in.
const invocationsWriteEvery = time.Second

func newInvocations(reg prometheus.Registerer, gatewayMetrics bool, file string, log *slog.Logger) *invocations {
	inv := &invocations{counts: map[string]float64{}, file: file, log: log}
	if file != "" {
		switch raw, err := os.ReadFile(file); {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			log.Warn("invocation counts: cannot read them; counting from 0", "file", file, "err", err)
		default:
			if err := json.Unmarshal(raw, &inv.counts); err != nil {
				log.Warn("invocation counts: not a JSON object of counts; counting from 0", "file", file, "err", err)
				inv.counts = map[string]float64{}
			}
		}
	}
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
	inv.saveLocked()
	inv.mu.Unlock()
	if inv.metric != nil {
		inv.metric.WithLabelValues(key, strconv.Itoa(code)).Inc()
	}
}

// saveLocked writes the counts file now, or arms a timer that writes it once invocationsWriteEvery has passed
// since the last write. inv.mu is held.
func (inv *invocations) saveLocked() {
	if inv.file == "" || inv.pending {
		return
	}
	if wait := invocationsWriteEvery - time.Since(inv.written); wait > 0 {
		inv.pending = true
		time.AfterFunc(wait, func() {
			inv.mu.Lock()
			defer inv.mu.Unlock()
			inv.pending = false
			inv.writeLocked()
		})
		return
	}
	inv.writeLocked()
}

// writeLocked writes the counts to a temporary file renamed over the counts file. inv.mu is held.
func (inv *invocations) writeLocked() {
	inv.written = time.Now()
	raw, err := json.Marshal(inv.counts)
	if err == nil {
		tmp := inv.file + ".tmp"
		if err = os.MkdirAll(filepath.Dir(inv.file), 0o700); err == nil {
			if err = os.WriteFile(tmp, raw, 0o600); err == nil {
				err = os.Rename(tmp, inv.file)
			}
		}
	}
	if err != nil {
		inv.log.Warn("invocation counts: cannot write them (they restart from the last written on a restart)",
			"file", inv.file, "err", err)
	}
}

// forget drops a deleted function's counts.
func (inv *invocations) forget(name, namespace string) {
	key := invocationKey(name, namespace)
	inv.mu.Lock()
	delete(inv.counts, key)
	inv.saveLocked()
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

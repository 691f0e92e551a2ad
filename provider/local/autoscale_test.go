package local

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestAutoscalerScalesByRequestsInFlight: the backend's autoscaler, on the wall clock with short periods, scales a
// function (min 1, max 3, target 1 x 1.0) to 3 replicas while three requests it routed are in flight, back to 1 once
// they end and the scale-down window has passed, and to zero after its idle period; each decision is logged to the
// function's events and counted in the metrics.
func TestAutoscalerScalesByRequestsInFlight(t *testing.T) {
	e := newEnv(t)
	m := autoscale.NewMetrics()
	e.cfg.Autoscale = &autoscale.Config{Interval: 20 * time.Millisecond, ScaleDownWindow: 300 * time.Millisecond,
		Metrics: m}
	b := e.open(t)
	ctx := context.Background()
	fd := probe("probe")
	fd.Labels = &map[string]string{autoscale.LabelMin: "1", autoscale.LabelMax: "3",
		autoscale.LabelTargetProportion: "1"}
	fd.Annotations = &map[string]string{autoscale.LabelZero: "true", autoscale.LabelZeroDuration: "3s"}
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	replicas := func() uint64 {
		st, err := b.Status(ctx, "", "probe")
		if err != nil {
			t.Fatal(err)
		}
		return st.Replicas
	}
	var dones []func()
	for range 3 {
		_, done, err := b.Route(ctx, "", "probe") // waits for a ready replica; in flight until done
		if err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
	}
	testkit.Eventually(t, 10*time.Second, "3 replicas while 3 requests are in flight", func() bool {
		return replicas() == 3
	})
	waitReady(t, b, "probe", 3)
	ended := time.Now()
	for _, done := range dones {
		done()
		done() // twice is once
	}
	testkit.Eventually(t, 10*time.Second, "back to 1 replica after the load", func() bool { return replicas() == 1 })
	if since := time.Since(ended); since < 300*time.Millisecond {
		t.Fatalf("scaled down %s after the load ended, before the 300ms window", since)
	}
	testkit.Eventually(t, 15*time.Second, "zero replicas after 3s without a request", func() bool {
		return replicas() == 0
	})
	if up, down, zero := m.DecisionCount("probe.openfaas-fn", autoscale.Up),
		m.DecisionCount("probe.openfaas-fn", autoscale.Down),
		m.DecisionCount("probe.openfaas-fn", autoscale.Zero); up < 1 || down < 1 || zero != 1 {
		t.Fatalf("decisions up %v, down %v, zero %v", up, down, zero)
	}
	if text := logText(t, b, "probe"); strings.Count(text, "autoscaled from") < 3 ||
		!strings.Contains(text, "autoscaled from 1 to 3 replicas: 3 requests in flight") ||
		!strings.Contains(text, "autoscaled from 1 to 0 replicas: no request for") {
		t.Fatalf("the function's events:\n%s", text)
	}
	// A request wakes it with its minimum, and the autoscaler goes on from there.
	_, done, err := b.Route(ctx, "", "probe")
	if err != nil {
		t.Fatal(err)
	}
	done()
	if n := replicas(); n != 1 {
		t.Fatalf("%d replicas after a request woke it, want its minimum 1", n)
	}
}

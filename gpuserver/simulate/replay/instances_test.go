package replay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// TestParseScaleLabelsIsTheDeploysPolicy: the labels, with or without their prefix, parse to what a deploy
// parses them to; none is one instance; a label that asks for no autoscaling or a bad value is refused.
func TestParseScaleLabelsIsTheDeploysPolicy(t *testing.T) {
	labels, p, err := ParseScaleLabels("max=8, com.openfaas.scale.min=2,target-proportion=0.9", 10)
	if err != nil {
		t.Fatal(err)
	}
	want, err := autoscale.Parse(map[string]string{autoscale.LabelMax: "8", autoscale.LabelMin: "2",
		autoscale.LabelTargetProportion: "0.9"}, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p != want || !p.Autoscaled || len(labels) != 3 || labels[autoscale.LabelMax] != "8" {
		t.Errorf("labels %v policy %+v, want %+v", labels, p, want)
	}
	if labels, p, err := ParseScaleLabels(" ", 10); err != nil || labels != nil || p.Autoscaled {
		t.Errorf("empty: %v %+v %v, want no labels", labels, p, err)
	}
	for _, bad := range []string{"min=2", "max=11", "max", "max=0", "type=rps"} {
		if _, _, err := ParseScaleLabels(bad, 10); !errors.Is(err, ErrInvalidWindow) {
			t.Errorf("%q: %v, want ErrInvalidWindow", bad, err)
		}
	}
}

// TestCompareInstancesOverTime: the simulator's count at each of the real node's samples follows its decisions
// (an instance ready InstanceStart after the decision that started it, stopped ones gone at once); a function
// that scaled on either side has a series, one that scaled on neither has none.
func TestCompareInstancesOverTime(t *testing.T) {
	_, ms := load(t)
	fns, err := Functions(ms, 3)
	if err != nil {
		t.Fatal(err)
	}
	events := []simulate.ScaleEvent{
		{At: 2 * time.Second, Function: 0, From: 1, To: 3},
		{At: 10 * time.Second, Function: 0, From: 3, To: 1},
	}
	sample := func(at time.Duration, f0, f1, f2 Replicas) Sample {
		return Sample{At: at, Replicas: []Replicas{f0, f1, f2}}
	}
	one := Replicas{Desired: 1, Ready: 1}
	samples := []Sample{
		sample(0, one, one, one),
		sample(3*time.Second, Replicas{3, 1}, one, one),
		sample(5*time.Second, Replicas{3, 3}, one, Replicas{2, 1}),
		sample(11*time.Second, Replicas{3, 3}, one, Replicas{2, 2}),
	}
	got := CompareInstances(fns, samples, events, 1, 2*time.Second)
	if len(got) != 2 || got[0].Function != fns[0].Name || got[1].Function != fns[2].Name {
		t.Fatalf("series %+v, want functions 0 (scaled on both sides) and 2 (on the real node)", got)
	}
	f0 := got[0]
	wantSim := []Replicas{{1, 1}, {3, 1}, {3, 3}, {1, 1}}
	for i, p := range f0.Points {
		if (Replicas{p.SimDesired, p.SimReady}) != wantSim[i] {
			t.Errorf("at %.0fs: simulator %d desired %d ready, want %+v", p.At, p.SimDesired, p.SimReady, wantSim[i])
		}
	}
	if f0.RealPeak != 3 || f0.SimPeak != 3 || f0.RealUps != 1 || f0.SimUps != 1 || f0.RealDowns != 0 ||
		f0.SimDowns != 1 || f0.RealMean != 2 || f0.SimMean != 1.5 || f0.MeanAbsDiff != 0.5 {
		t.Errorf("function 0: %+v", f0)
	}
	if got[1].SimPeak != 1 || got[1].RealPeak != 2 {
		t.Errorf("function 2: %+v", got[1])
	}
	if tl := f0.Timeline(5 * time.Second); tl != "0s 1/1, 5s 3/3, 11s 3/1" {
		t.Errorf("timeline %q", tl)
	}
}

// TestPollReplicasUntilCancelled: the samples come every interval until the context ends, a failed look is left
// out and its error kept.
func TestPollReplicasUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	samples, err := PollReplicas(ctx, time.Millisecond, 1, func(context.Context) ([]Replicas, error) {
		calls++
		if calls == 2 {
			return nil, errors.New("gateway busy")
		}
		if calls == 5 {
			cancel()
		}
		return []Replicas{{Desired: calls, Ready: calls}}, nil
	})
	if len(samples) != 4 || samples[3].Replicas[0].Ready != 5 || err == nil || err.Error() != "gateway busy" {
		t.Errorf("%d samples %+v, error %v: want 4 (the second look failed), its error", len(samples), samples, err)
	}
	for i := 1; i < len(samples); i++ {
		if samples[i].At < samples[i-1].At {
			t.Errorf("samples out of order: %+v", samples)
		}
	}
}

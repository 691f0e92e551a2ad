package repository_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

func capture(t *testing.T, r *repository.Repository, fn string, fill byte, sizes ...uint64) {
	t.Helper()
	var segs []repository.Segment
	for i, s := range sizes {
		segs = append(segs, repository.Segment{ID: i, Ptr: device.Ptr(0x7f0000000000 + i<<24), Size: s})
	}
	im, err := r.Create(context.Background(), fn, segs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range segs {
		b := im.Bytes(i)
		for j := range b {
			b[j] = fill + byte(i) + byte(j%7)
		}
	}
	if err := im.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := im.Release(); err != nil {
		t.Fatal(err)
	}
}

func check(t *testing.T, r *repository.Repository, fn string, fill byte) {
	t.Helper()
	im, err := r.Get(context.Background(), fn)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	for i, s := range im.Segments() {
		want := make([]byte, s.Size)
		for j := range want {
			want[j] = fill + byte(i) + byte(j%7)
		}
		if !bytes.Equal(im.Bytes(i), want) {
			t.Fatalf("%s segment %d: bytes differ", fn, i)
		}
		if s.Ptr != device.Ptr(0x7f0000000000+i<<24) {
			t.Fatalf("%s segment %d: address %#x changed", fn, i, s.Ptr)
		}
	}
}

// registrar records page-locked ranges like a device backend.
type registrar struct{ live map[*byte]int }

func (g *registrar) RegisterHost(b []byte) error {
	if _, ok := g.live[&b[0]]; ok {
		return errors.New("registered twice")
	}
	g.live[&b[0]] = len(b)
	return nil
}
func (g *registrar) UnregisterHost(b []byte) error {
	if _, ok := g.live[&b[0]]; !ok {
		return errors.New("not registered")
	}
	delete(g.live, &b[0])
	return nil
}

func TestRestartKeepsImages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	reg := &registrar{live: map[*byte]int{}}
	r, err := repository.Open(repository.Config{Dir: dir, Registrar: reg})
	if err != nil {
		t.Fatal(err)
	}
	capture(t, r, "resnet50", 1, 4<<20, 2<<20)
	capture(t, r, "odd/name with spaces", 9, 1<<20)
	if len(reg.live) != 2 {
		t.Fatalf("%d images registered, want 2", len(reg.live))
	}
	// an image that is never committed does not survive
	im, err := r.Create(context.Background(), "half", []repository.Segment{{Size: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil { // the gpuserver goes away mid-capture
		t.Fatal(err)
	}
	_ = im
	if len(reg.live) != 0 {
		t.Fatalf("close left %d registrations", len(reg.live))
	}

	r2, err := repository.Open(repository.Config{Dir: dir, Registrar: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got := r2.Functions(); len(got) != 2 || got[0] != "odd/name with spaces" || got[1] != "resnet50" {
		t.Fatalf("functions after restart: %v", got)
	}
	check(t, r2, "resnet50", 1)
	check(t, r2, "odd/name with spaces", 9)
	if r2.Has("half") {
		t.Fatal("an uncommitted image survived the restart")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.new")); len(left) != 0 {
		t.Fatalf("leftover files: %v", left)
	}
	if err := r2.Delete("resnet50"); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Get(context.Background(), "resnet50"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
}

func TestBudgetSpillsLeastRecentlyUsedUnheld(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	metrics := prometheus.NewRegistry()
	r, err := repository.Open(repository.Config{Dir: filepath.Join(t.TempDir(), "shm"), SpillDir: t.TempDir(),
		BudgetBytes: 8 << 20, Now: clock, Registerer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	capture(t, r, "a", 1, 3<<20)
	capture(t, r, "b", 2, 3<<20)
	held, err := r.Get(ctx, "a") // a is now the most recently used, and held
	if err != nil {
		t.Fatal(err)
	}
	capture(t, r, "c", 3, 3<<20) // must spill b (a is held)
	st := r.Stats()
	if st.Spills != 1 || st.HostBytes != 6<<20 || st.SpilledBytes != 3<<20 {
		t.Fatalf("stats after the first spill: %+v", st)
	}
	if got := spills(t, metrics); got != 1 {
		t.Fatalf("spill metric %v, want 1", got)
	}
	if _, err := r.Get(ctx, "b"); !errors.Is(err, repository.ErrBudget) && err != nil {
		t.Fatal(err)
	}
	// b came back by spilling c (a is still held)
	check(t, r, "b", 2)
	if st := r.Stats(); st.Loads != 1 || st.Spills != 2 {
		t.Fatalf("stats after loading b back: %+v", st)
	}
	if _, err := r.Create(ctx, "huge", []repository.Segment{{Size: 16 << 20}}); !errors.Is(err, repository.ErrBudget) {
		t.Fatalf("image over the budget: %v", err)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	check(t, r, "a", 1)
	check(t, r, "c", 3)
	if err := held.Release(); !errors.Is(err, repository.ErrInvalid) {
		t.Fatalf("double release: %v", err)
	}
}

func spills(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "faas_gpu_repository_spills_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("spill metric not registered")
	return 0
}

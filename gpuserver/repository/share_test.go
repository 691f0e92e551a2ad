package repository_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// variant captures an image of a base segment (the same bytes in every variant) and a head segment of its own.
func variant(t *testing.T, r *repository.Repository, fn, domain string, base, head uint64, seed byte) {
	t.Helper()
	segs := []repository.Segment{{ID: 0, Ptr: 0x7f0000000000, Size: base}, {ID: 1, Ptr: 0x7f0001000000, Size: head}}
	im, err := r.CreateIn(context.Background(), fn, domain, segs)
	if err != nil {
		t.Fatal(err)
	}
	fillBase(im.Bytes(0))
	for j, b := 0, im.Bytes(1); j < len(b); j++ {
		b[j] = seed ^ byte(j*13)
	}
	if err := im.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := im.Release(); err != nil {
		t.Fatal(err)
	}
}

// fillBase fills the base with bytes that repeat nowhere (no two chunks of it alike).
func fillBase(b []byte) {
	g := rand.NewChaCha8([32]byte{1})
	_, _ = g.Read(b)
}

func checkVariant(t *testing.T, r *repository.Repository, fn string, seed byte) {
	t.Helper()
	im, err := r.Get(context.Background(), fn)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	want := make([]byte, len(im.Bytes(0)))
	fillBase(want)
	if !bytes.Equal(im.Bytes(0), want) {
		t.Fatalf("%s: base bytes differ", fn)
	}
	head := im.Bytes(1)
	for j := range head {
		if head[j] != seed^byte(j*13) {
			t.Fatalf("%s: head byte %d differs", fn, j)
		}
	}
}

// TestVariantsShareHostChunks: 16 variants of one base (same base bytes, a chunk of their own each: the llm
// function's variants carry a LoRA adapter there) in one domain hold the base's chunks once: the repository holds the
// base once and one own chunk per variant (here a base of 80 chunks, so the own chunk is 1.2% of a model and 16
// variants take 1.19 times one model's host memory; the llm function's base is 349 chunks of 2 MiB, measured by
// make bench-llm). Every image reads back its
// own bytes, also after a restart and after other variants are deleted; images of another domain share nothing; a
// spilled and reloaded variant shares again.
func TestVariantsShareHostChunks(t *testing.T) {
	const chunk = 64 << 10
	const base, head = 80 * chunk, chunk
	dir := filepath.Join(t.TempDir(), "shm")
	reg := &registrar{live: map[*byte]int{}}
	cfg := repository.Config{Dir: dir, Registrar: reg, ChunkBytes: chunk}
	r, err := repository.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		variant(t, r, fmt.Sprintf("llm-%d", i), "tenant a", base, head, byte(i))
	}
	model := uint64(base + head)
	st := r.Stats()
	t.Logf("16 variants: %d bytes of host memory for %d bytes of images (one model: %d, %.3fx)", st.HostBytes,
		st.LogicalBytes, model, float64(st.HostBytes)/float64(model))
	if st.HostBytes != base+16*head || st.LogicalBytes != 16*model || st.Chunks != 80+16 {
		t.Fatalf("stats %+v: want the base once and 16 heads (%d bytes)", st, base+16*head)
	}
	if float64(st.HostBytes) > 1.2*float64(model) {
		t.Fatalf("16 variants take %.3f times one model's host memory, want <= 1.2", float64(st.HostBytes)/float64(model))
	}
	for i := range 16 {
		checkVariant(t, r, fmt.Sprintf("llm-%d", i), byte(i))
	}
	// Another domain (tenant) shares nothing.
	variant(t, r, "other", "tenant b", base, head, 99)
	if st2 := r.Stats(); st2.HostBytes != st.HostBytes+model {
		t.Fatalf("an image of another domain: host bytes %d -> %d, want +%d", st.HostBytes, st2.HostBytes, model)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	r, err = repository.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st3 := r.Stats(); st3.HostBytes != st.HostBytes+model || st3.Images != 17 {
		t.Fatalf("after a restart: %+v", st3)
	}
	for i := range 15 {
		if err := r.Delete(fmt.Sprintf("llm-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	checkVariant(t, r, "llm-15", 15)
	if st4 := r.Stats(); st4.HostBytes != 2*model {
		t.Fatalf("after deleting 15 variants: %d host bytes, want %d", st4.HostBytes, 2*model)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if len(reg.live) != 0 {
		t.Fatalf("%d registrations left", len(reg.live))
	}
}

// TestSharedVariantSpillsAndLoads: under a host memory budget a variant is spilled flat and shares its chunks again
// when it is loaded back.
func TestSharedVariantSpillsAndLoads(t *testing.T) {
	const chunk = 64 << 10
	const base, head = 8 * chunk, chunk
	dir := t.TempDir()
	r, err := repository.Open(repository.Config{Dir: filepath.Join(dir, "shm"), SpillDir: filepath.Join(dir, "spill"),
		BudgetBytes: 2 * (base + head), ChunkBytes: chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 3 {
		variant(t, r, fmt.Sprintf("v%d", i), "t", base, head, byte(i))
	}
	for i := range 3 {
		checkVariant(t, r, fmt.Sprintf("v%d", i), byte(i))
	}
	if st := r.Stats(); st.Spills == 0 || st.Loads == 0 {
		t.Fatalf("stats %+v: want spills and loads under the budget", st)
	}
}

package remoting

import (
	"bytes"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestModuleImagesBounded is the image bomb: a function's sessions send chunks of module images that never
// complete, to grow the server. Before, each session buffered up to 1 GiB and a function could open 64 sessions.
// Now the chunks count against the function's bound (8 MiB here) across all its sessions, and against the
// node's (12 MiB here): the bomb is refused with CUDA_ERROR_OUT_OF_MEMORY at its bound, another function still
// loads its modules, and one that tries to take the rest of the node is refused at the node's bound. Identical
// images are held once however many sessions load them, and everything is given back when the sessions end.
func TestModuleImagesBounded(t *testing.T) {
	const perFunction, node = 8 << 20, 12 << 20
	funcs := tenants(pool.FunctionSpec{Name: "bomb.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "other.ns2", MemoryBytes: 64 << 20})
	r := startServerWith(t, funcs, func(c *Config) {
		c.MaxModuleBytesPerFunction, c.MaxModuleBytes = perFunction, node
	})
	images := r.srv.cfg.images
	chunk := bytes.Repeat([]byte{0xab}, 256<<10)
	// feed sends chunks on w until one is refused (or max chunks went through); it returns the accepted bytes.
	feed := func(w *wireClient, max int) (accepted uint64, refused bool) {
		for range max {
			res, _, err := w.call(CallModuleImageChunk, chunk, uint64(len(chunk)))
			if err != nil {
				t.Fatal(err)
			}
			if res != ResultSuccess {
				if res != ResultOutOfMemory {
					t.Fatalf("chunk refused with %d, want CUDA_ERROR_OUT_OF_MEMORY", res)
				}
				return accepted, true
			}
			accepted += uint64(len(chunk))
		}
		return accepted, false
	}
	// One session holds 6 MiB of an image it never completes; the next ones get the rest of the bound at most,
	// whatever they offer (16 MiB each), and a refused session's chunks are dropped.
	var bombs []*wireClient
	for i := range 3 {
		w, err := dialWire(t, r.sock, "bomb.ns1", "tok-bomb.ns1")
		if err != nil {
			t.Fatal(err)
		}
		bombs = append(bombs, w)
		offer := 64
		if i == 0 {
			offer = 24
		}
		n, refused := feed(w, offer)
		fn, _ := images.usage("bomb.ns1")
		switch {
		case i == 0 && (refused || n != 6<<20):
			t.Fatalf("first session: %d bytes accepted (refused %v), want 6 MiB", n, refused)
		case i > 0 && (!refused || n > perFunction-6<<20):
			t.Fatalf("session %d: %d bytes accepted (refused %v) beside 6 MiB held, bound %d", i, n, refused,
				perFunction)
		case fn != 6<<20:
			t.Fatalf("the bomb holds %d bytes after session %d, want the first session's 6 MiB", fn, i)
		}
	}

	// Another function loads a module and computes beside the bomb; two of its sessions load the same image,
	// which the node holds once.
	var others []*wireClient
	for range 2 {
		w, err := dialWire(t, r.sock, "other.ns2", "tok-other.ns2")
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, w)
		if res, _, err := w.call(CallCuModuleLoadData, kernels.PTX(), uint64(len(kernels.PTX()))); err != nil ||
			res != ResultSuccess {
			t.Fatalf("other's module: %d %v", res, err)
		}
	}
	fn, before := images.usage("other.ns2")
	if fn != uint64(len(kernels.PTX())) {
		t.Fatalf("other holds %d bytes of images, want one copy of %d", fn, len(kernels.PTX()))
	}
	// It takes what the node has left, and no more.
	n, refused := feed(others[0], 64)
	if _, all := images.usage("other.ns2"); !refused || all > node || before+n > node {
		t.Fatalf("other's chunks: %d accepted, refused %v, node holds %d (bound %d)", n, refused, all, node)
	}

	for _, w := range append(bombs, others...) {
		w.close()
	}
	testkit.Eventually(t, 60*time.Second, "every image and chunk given back", func() bool {
		_, all := images.usage("")
		return all == 0
	})
}

// TestLoadOfARefusedImageIsOutOfMemory: once a chunk of an image is refused (beyond a bound), its other chunks and
// the load that would complete it answer CUDA_ERROR_OUT_OF_MEMORY. Before, the chunks after the refused one were
// kept again and the load read the last ones as a whole image: CUDA_ERROR_INVALID_IMAGE, which says nothing of
// the bound.
func TestLoadOfARefusedImageIsOutOfMemory(t *testing.T) {
	funcs := tenants(pool.FunctionSpec{Name: "f.ns1", MemoryBytes: 64 << 20})
	r := startServerWith(t, funcs, func(c *Config) { c.MaxModuleBytesPerFunction = 1 << 20 })
	r.binder.bind("f.ns1", 0)
	w, err := dialWire(t, r.sock, "f.ns1", "tok-f.ns1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	head := []byte(".version 7.0\n.target sm_50\n.address_size 64\n//")
	pad := bytes.Repeat([]byte{'x'}, 256<<10)
	var results []Result
	for _, c := range [][]byte{append(head, pad...), pad, pad, pad, pad, pad} {
		res, _, err := w.call(CallModuleImageChunk, c, uint64(len(c)))
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	if results[0] != ResultSuccess || results[len(results)-1] != ResultOutOfMemory {
		t.Fatalf("chunks of a 1.5 MiB image under a 1 MiB bound: %v", results)
	}
	last := []byte("\n")
	if res, _, err := w.call(CallCuModuleLoadData, last, uint64(len(last))); err != nil || res != ResultOutOfMemory {
		t.Fatalf("the load completing the refused image: %d %v, want CUDA_ERROR_OUT_OF_MEMORY", res, err)
	}
	// The next image loads.
	if res, _, err := w.call(CallCuModuleLoadData, kernels.PTX(), uint64(len(kernels.PTX()))); err != nil ||
		res != ResultSuccess {
		t.Fatalf("the next image: %d %v", res, err)
	}
}

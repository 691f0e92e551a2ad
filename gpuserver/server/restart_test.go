package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestRestartReusesTheMLPImage captures the mlp, restarts the gpuserver on the same repository and key file, and
// serves a new mlp process from the image kept in the repository: its model blocks land at the image's fixed
// addresses, its initialisation copies are found equal to the image and skipped, nothing is captured again, and it
// answers exactly as before the restart.
func TestRestartReusesTheMLPImage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in Python processes through the shim")
	}
	dir := t.TempDir()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &testkit.Buffer{}
	cfg := Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 512 << 20,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	// The mlp process outlives its gpuserver, as a function's pod outlives a gpuserver restart (a process that
	// ends while its gpuserver runs makes it forget the function: remoting Server.sessionEnded).
	serve := func(s *Server) (*mlpDriver, string, []uint64) {
		t.Helper()
		p := s.Pool()
		if err := p.Register(ctx, pool.FunctionSpec{Name: "mlp", MemoryBytes: 512 << 20}); err != nil {
			t.Fatal(err)
		}
		d := startMLP(t, s)
		b, err := p.Acquire(ctx, "mlp")
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Send(string(mlpInput()))
		var a mlpAnswer
		d.recv(t, &a)
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
		if a.StatusCode != 200 {
			t.Fatalf("mlp: %d %s\nstderr:\n%s", a.StatusCode, a.Body, d.Stderr())
		}
		segs, err := s.Executors().Segments("mlp")
		if err != nil {
			t.Fatal(err)
		}
		var ptrs []uint64
		for _, sg := range segs {
			if sg.Kind == memory.KindModel {
				ptrs = append(ptrs, uint64(sg.Ptr), sg.Size)
			}
		}
		return d, string(a.Body), ptrs
	}

	s1, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d1, before, segs1 := serve(s1)
	if st := s1.Executors().Images(); st.Captures != 1 || st.Reused != 0 {
		t.Fatalf("first server: %+v, want one capture", st)
	}
	stop(t, s1)
	d1.Close() // its shim cannot resume a session with the new gpuserver: a new process takes over

	s2, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s2)
	_, after, segs2 := serve(s2)
	if after != before {
		t.Fatalf("after the restart the mlp answered differently:\n%.200s\nbefore:\n%.200s", after, before)
	}
	st := s2.Executors().Images()
	if st.Captures != 0 || st.Reused != 1 || st.Fallbacks != 0 {
		t.Fatalf("restarted server: %+v, want the image reused and nothing captured\nlog:\n%s", st, logs)
	}
	if st.SkippedBytes < 140<<20 {
		t.Fatalf("restarted server skipped %d bytes of initialisation copies, want the mlp's ~155 MB model", st.SkippedBytes)
	}
	if len(segs2) == 0 || fmt.Sprint(segs1) != fmt.Sprint(segs2) {
		t.Fatalf("model segments (address, size) after the restart %#x, before %#x", segs2, segs1)
	}
	if !strings.Contains(logs.String(), "nothing captured") {
		t.Fatalf("no log line says the image was reused:\n%s", logs)
	}
}

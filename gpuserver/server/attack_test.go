package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// tenantPy is a function process through the shim that is victim and attacker at once (see the script).
var tenantPy = func() string {
	b, err := os.ReadFile("../tenant/testdata/tenant_fn.py")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// What tenantPy reads: its own model doubled, the victim's global doubled.
const (
	sumModel  = "sum 1.0496e+06"
	sumGlobal = "sum 1.12876e+07"
)

// startTenantFn starts tenantPy as fn and returns it with the addresses of its model and its module global.
func startTenantFn(t *testing.T, s *Server, fn string) (*fnProcess, uint64, uint64) {
	t.Helper()
	p := startFnProcess(t, s, fn, tenantPy)
	l, err := p.next()
	var model, global uint64
	if _, serr := fmt.Sscanf(l, "ready %d %d", &model, &global); err != nil || serr != nil {
		t.Fatalf("%s said %q (%v)\n%s", fn, l, err, p.Stderr())
	}
	return p, model, global
}

// imageAddress finds where fn's image holds the bytes at device address ptr in the host memory of process pid (the
// gpuserver's own in one process, the tenant's executor otherwise), from the image's sidecar and /proc/<pid>/maps:
// the mapping of the chunk file holding them (images are stored as content-addressed chunks), or of the flat image
// file, plus the offset.
func imageAddress(t *testing.T, pid int, repoDir, fn string, ptr uint64) uint64 {
	t.Helper()
	var metaPath string
	_ = filepath.Walk(repoDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && filepath.Base(p) == fn+".meta.json" {
			metaPath = p
		}
		return nil
	})
	if metaPath == "" {
		t.Fatalf("no image of %s under %s", fn, repoDir)
	}
	return hostAddressOf(t, pid, metaPath, ptr)
}

// hostAddressOf finds device address ptr of the image whose sidecar is metaPath in process pid's memory.
func hostAddressOf(t *testing.T, pid int, metaPath string, ptr uint64) uint64 {
	t.Helper()
	raw, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Segments []struct {
			Ptr, Size, Offset uint64
			Chunks            []string
		} `json:"segments"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	mapped := func(file string) uint64 {
		for _, line := range strings.Split(string(maps), "\n") {
			if strings.HasSuffix(line, file) {
				start, _ := strconv.ParseUint(line[:strings.IndexByte(line, '-')], 16, 64)
				return start
			}
		}
		t.Fatalf("process %d has no mapping of %s", pid, file)
		return 0
	}
	const chunk = 2 << 20 // repository.DefaultChunkBytes
	for _, s := range meta.Segments {
		if ptr < s.Ptr || ptr >= s.Ptr+s.Size {
			continue
		}
		off := ptr - s.Ptr
		if len(s.Chunks) > 0 {
			return mapped(filepath.Join(filepath.Dir(metaPath), "chunks", s.Chunks[off/chunk])) + off%chunk
		}
		return mapped(strings.TrimSuffix(metaPath, ".meta.json")+".img") + s.Offset + off
	}
	t.Fatalf("%#x is in no segment of the image %s", ptr, metaPath)
	return 0
}

// TestTenantCannotReadAnotherTenant is the attack matrix of docs/tenants.md on one simulated GPU that models what an
// H100 shares within one process (SimProcessWide). The victim (namespace ns1) holds a model (captured as its image)
// and a module global; an attacker of namespace ns2 launches kernels that read the victim's device address, its
// module global and its image in host memory, then one that faults.
//
// In one process (before): the device read faults (the executors park the victim), but the module global and the
// host image are read, and the attacker's fault poisons the victim too. With an executor process per tenant
// (after): every read faults in the attacker's own executor, which ends and is restarted; the victim never notices.
func TestTenantCannotReadAnotherTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"one process", "executor per tenant"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cfg := Config{Node: node, DeviceReserveBytes: 256 << 20, SimProcessWide: true}
			if mode != "one process" {
				cfg.Tenants, _ = tenantConfig(t)
			}
			dir := t.TempDir()
			cfg.Socket, cfg.RemotingSocket = filepath.Join(dir, "gpuserver.sock"), filepath.Join(dir, "remoting.sock")
			cfg.KeyFile, cfg.RepositoryDir = filepath.Join(dir, "key"), filepath.Join(dir, "repository")
			s, err := Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer stop(t, s)
			for _, fn := range []string{"victim.ns1", "attacker.ns2"} {
				if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
					t.Fatal(err)
				}
			}
			victim, model, global := startTenantFn(t, s, "victim.ns1")
			if l, _, err := request(ctx, s, victim, "victim.ns1", "good"); l != sumModel || err != nil {
				t.Fatalf("the victim's first request: %q %v", l, err)
			}
			pid := os.Getpid()
			if s.Tenants() != nil {
				pid = s.Tenants().PID("namespace/ns1")
			}
			host := imageAddress(t, pid, cfg.RepositoryDir, "victim.ns1", model)

			attack := func(what string, addr uint64) (string, error) {
				a, _, _ := startTenantFn(t, s, "attacker.ns2")
				l, _, err := request(ctx, s, a, "attacker.ns2", fmt.Sprintf("read %d", addr))
				t.Logf("%s: the attacker's kernel read %q (release: %v)", what, l, err)
				return l, err
			}
			victimOK := func(when string) bool {
				l, _, err := request(ctx, s, victim, "victim.ns1", "good")
				t.Logf("the victim %s: %q %v", when, l, err)
				return l == sumModel && err == nil
			}
			if mode == "one process" {
				if l, _ := attack("module global", global); l != sumGlobal {
					t.Errorf("one process: the attacker read the victim's module global as %q; the H100 model says "+
						"it is readable (%s)", l, sumGlobal)
				}
				if l, _ := attack("host image", host); l != sumModel {
					t.Errorf("one process: the attacker read the victim's image as %q; the H100 model says it is "+
						"readable (%s)", l, sumModel)
				}
				if l, _ := attack("device memory", model); !strings.HasPrefix(l, "fault") {
					t.Errorf("one process: the attacker read the victim's device memory as %q: want a fault", l)
				}
				if victimOK("after the attacker's fault") {
					t.Errorf("one process: the victim served after the attacker's fault poisoned the process; the " +
						"H100 model says every context of the process is poisoned")
				}
				return
			}
			pid2 := s.Tenants().PID("namespace/ns1")
			for _, c := range []struct {
				what string
				addr uint64
			}{{"device memory", model}, {"module global", global}, {"host image", host}} {
				l, err := attack(c.what, c.addr)
				if !strings.HasPrefix(l, "fault") || err == nil {
					t.Errorf("%s: the attacker read %q (release %v): want a fault in its own executor", c.what, l, err)
				}
				if !victimOK("after the attack on its " + c.what) {
					t.Errorf("the victim failed after the attack on its %s", c.what)
				}
			}
			if got := s.Tenants().PID("namespace/ns1"); got != pid2 {
				t.Errorf("the victim's executor changed (%d -> %d)", pid2, got)
			}
			for _, ts := range s.Pool().Status(ctx).Tenants {
				if ts.Tenant == "namespace/ns2" && ts.Faults != 3 {
					t.Errorf("the attacker's executor: %+v, want 3 faults", ts)
				}
				if ts.Tenant == "namespace/ns1" && (ts.Faults != 0 || ts.Restarts != 0) {
					t.Errorf("the victim's executor: %+v", ts)
				}
			}
		})
	}
}
